"""``purgatory serve`` (and ``python -m purgatory.adapters.service.serve``): one instance of the
service in the foreground.

The service on uvicorn with its own protocols (the long-poll and HTTP/2 fast paths), its
``service.*`` settings applied to uvicorn (TLS, head bounds), ``log.*`` applied, and the scale-out
shutdown order (:class:`ReleasingServer`: leave the ownership group, then wait for open
requests, then drain). Settings come from ``PURGATORY_*`` and ``PURGATORY_CONFIG_FILE``; with
``scaleout.enabled`` and no ``scaleout.advertised_url``, the URL defaults to
``http://<host>:<port>`` — right on one machine, wrong behind NAT or in a container network,
where it must be set. SIGTERM or SIGINT stops it gracefully.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import uvicorn

from purgatory.settings import ConfigError, load_settings

from .app._app import apply_log_settings, create_app
from .cli import DEFAULT_BACKLOG, DEFAULT_PORT, GRACEFUL_SHUTDOWN_S
from .server._server import ReleasingServer, uvicorn_options

__all__ = ["main", "serve"]

DESCRIPTION = "One instance of the service in the foreground, with its fast paths (HTTP/1.1 long poll, h2c)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="purgatory-serve", description=DESCRIPTION)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--fd", type=int, default=None, help="serve on this already-bound socket (its port wins over --port)"
    )
    parser.add_argument("--graceful-shutdown-s", type=int, default=GRACEFUL_SHUTDOWN_S)
    parser.add_argument("--backlog", type=int, default=DEFAULT_BACKLOG, help="listen backlog (connections)")
    args = parser.parse_args(argv)
    return serve(args.host, args.port, args.fd, args.graceful_shutdown_s, args.backlog)


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    fd: int | None = None,
    graceful_shutdown_s: int = GRACEFUL_SHUTDOWN_S,
    backlog: int = DEFAULT_BACKLOG,
) -> int:
    """Serve until SIGTERM or SIGINT (module docstring); the process's exit status (2: bad settings)."""
    if fd is not None:  # a parent bound the port (no race between choosing and binding it)
        with socket.socket(fileno=os.dup(fd)) as bound:
            host, port = bound.getsockname()[:2]
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    # The process is the service's own: its log.* settings win (level, JSON or console).
    apply_log_settings(settings, override=True)
    if settings.scaleout.enabled and settings.scaleout.advertised_url is None:
        url = f"http://{host}:{port}"
        settings = settings.model_copy(
            update={"scaleout": settings.scaleout.model_copy(update={"advertised_url": url})}
        )
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        fd=fd,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=graceful_shutdown_s,
        backlog=backlog,
        # TLS, the request head's size and time bounds; the protocols get the app's endpoint.
        **uvicorn_options(settings.service, app.state.endpoint),
    )
    ReleasingServer(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
