"""``purgatory serve``: the service on its own server (entry point ``serve`` in group ``purgatory.cli``).

The same as ``python -m purgatory.adapters.service.serve`` (:mod:`.serve`): settings from
``PURGATORY_*`` and ``PURGATORY_CONFIG_FILE``, ``log.*`` applied, the long-poll and HTTP/2 fast
paths on. This module stays light, as :mod:`.run`: uvicorn and the app are imported only when
``serve`` runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["DEFAULT_BACKLOG", "DEFAULT_PORT", "GRACEFUL_SHUTDOWN_S", "serve"]

# serve.py's defaults too (here: this module is imported by every `purgatory` command, serve.py not).
DEFAULT_PORT = 8080
DEFAULT_BACKLOG = 2048  # uvicorn's
GRACEFUL_SHUTDOWN_S = 10  # open requests' bound once the group was left (docker stop grants 15 s)


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on (default: loopback).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = DEFAULT_PORT,
    fd: Annotated[
        int | None, typer.Option(help="Serve on this already-bound socket (its port wins over --port).")
    ] = None,
    graceful_shutdown_s: Annotated[
        int, typer.Option(min=0, help="Seconds open requests get at shutdown (after leaving the group).")
    ] = GRACEFUL_SHUTDOWN_S,
    backlog: Annotated[int, typer.Option(min=1, help="Listen backlog (connections).")] = DEFAULT_BACKLOG,
) -> None:
    """Run the HTTP service in the foreground, with its fast paths (HTTP/1.1 long poll, h2c)."""
    from .serve import serve as serve_forever

    status = serve_forever(host, port, fd, graceful_shutdown_s, backlog)
    if status:
        raise typer.Exit(status)
