"""Run the ASGI app under uvicorn on a background thread (``purgatory run`` and the tests use it).

``with BackgroundServer(app) as server: server.url`` binds ``127.0.0.1`` on a port the kernel
chooses (port 0: no race between picking a free port and binding it), returns once the app's
lifespan startup finished, and on exit asks uvicorn to stop (graceful: open requests finish, then
the lifespan shutdown drains the purgatories) and joins the thread, both bounded.

The ``service.*`` settings of the app (``app.state.settings``) shape uvicorn itself
(:func:`uvicorn_options`): TLS, mutual TLS, and the bounds on a request head's size (h11's) and time (ours).

Concurrency contract: start and stop from one thread. uvicorn installs no signal handlers off
the main thread, so Ctrl-C still reaches the caller.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from types import TracebackType
from typing import Any, Self

import structlog
import uvicorn

from ..http._endpoint import LongPollEndpoint
from ..http.h1._head_timeout import head_timeout_protocol
from ..http.h1._long_poll import long_poll_protocol
from ..http.h2._prior_knowledge import http2_capable
from ..settings import ServiceSettings

__all__ = ["BackgroundServer", "ReleasingServer", "ServerStartError", "uvicorn_options"]

START_TIMEOUT_S = 30.0  # lifespan startup builds clients only (no Kafka round trip): seconds at most
STOP_TIMEOUT_S = 30.0  # graceful shutdown (bounded below) plus the purgatories' drain
GRACEFUL_SHUTDOWN_S = 5  # open long polls get this long to finish before uvicorn cancels them
_log = structlog.get_logger("purgatory.service")

STARTED_POLL_S = 0.02  # uvicorn exposes startup as a flag, not an event: poll it, bounded


def uvicorn_options(service: ServiceSettings, endpoint: LongPollEndpoint | None = None) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments from the ``service.*`` settings.

    On uvicorn's command line, ``--http purgatory.adapters.service:LongPollHttp`` makes the same
    protocol classes from the settings (:mod:`._long_poll_http`); TLS and h11's head size come
    from uvicorn's own options there (``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-ca-certs``,
    ``--ssl-cert-reqs 2``, ``--h11-max-incomplete-event-size``).
    """
    options: dict[str, Any] = {
        # h11 buffers at most this much of an incomplete request head (request line and header
        # fields) and refuses the rest; the app's HeaderLimits then holds the same bound in JSON.
        "h11_max_incomplete_event_size": service.max_header_bytes,
        # ... and this protocol bounds the time a head may take (uvicorn bounds none: a slowly
        # trickled head holds its connection for ever). Always h11, even where httptools is
        # installed: the size bound above is h11's.
        # With service.fast_long_poll, the same protocol also serves idle long polls itself
        # (._long_poll: a waiting poll holds no task; anything else goes through the app).
        "http": (
            long_poll_protocol(service.head_read_timeout_ms / 1000.0, endpoint)
            if service.fast_long_poll
            else head_timeout_protocol(service.head_read_timeout_ms / 1000.0)
        ),
    }
    if service.http2:  # h2c with prior knowledge on the same port (..http.h2)
        options["http"] = http2_capable(options["http"], endpoint)
    if service.tls_certfile is not None:
        options |= {
            "ssl_certfile": service.tls_certfile,
            "ssl_keyfile": service.tls_keyfile,
            "ssl_keyfile_password": (
                service.tls_keyfile_password.get_secret_value() if service.tls_keyfile_password else None
            ),
            "ssl_ca_certs": service.tls_ca_certs,
            "ssl_cert_reqs": ssl.CERT_REQUIRED if service.tls_client_auth == "required" else ssl.CERT_NONE,
        }
    return options


def _endpoint_of(app: Any) -> LongPollEndpoint | None:
    """The endpoint ``create_app`` built (``app.state.endpoint``); None for any other app."""
    endpoint = getattr(getattr(app, "state", None), "endpoint", None)
    return endpoint if isinstance(endpoint, LongPollEndpoint) else None


class ReleasingServer(uvicorn.Server):
    """uvicorn's server that lets the app give up what it holds *before* waiting for open requests.

    uvicorn's shutdown stops accepting, then waits up to ``timeout_graceful_shutdown`` for open
    requests, and only then runs the lifespan shutdown. A scaled-out instance must leave its
    ownership group first: the long polls it holds are then answered MOVED at once (their clients
    retry at the new owner) instead of waiting out the graceful timeout here, on partitions the
    group still believes are ours. The app names the step as ``app.state.release`` (an async
    callable); apps without one shut down exactly as under plain uvicorn.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        release = getattr(getattr(self.config.app, "state", None), "release", None)
        if callable(release):
            try:
                await release()
            except Exception:  # shutting down regardless: the lifespan shutdown still drains
                _log.exception("service_release_failed")
        await super().shutdown(sockets)


class ServerStartError(RuntimeError):
    """uvicorn did not come up (the lifespan startup failed or the port could not be bound)."""


class BackgroundServer:
    """uvicorn serving ``app`` on ``host`` (loopback by default) from a daemon thread."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        graceful_shutdown_s: int = GRACEFUL_SHUTDOWN_S,
    ) -> None:
        settings = getattr(getattr(app, "state", None), "settings", None)
        service: ServiceSettings = settings.service if settings is not None else ServiceSettings()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=graceful_shutdown_s,
            **uvicorn_options(service, _endpoint_of(app)),  # the protocols get the app's endpoint
        )
        self.server: uvicorn.Server = ReleasingServer(config)
        self.scheme = "https" if service.tls_certfile is not None else "http"
        self.host = host
        self.port = port
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def _serve(self) -> None:
        try:
            self.server.run()
        except BaseException as exc:  # reported by start(); a server thread must not die silently
            self._error = exc

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        self._thread = threading.Thread(target=self._serve, name="purgatory-service", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(
                    f"the service did not start within {timeout_s:.0f} s"
                    + (f": {self._error!r}" if self._error else " (see the log above)")
                )
            time.sleep(STARTED_POLL_S)
        sockets = [s for server in self.server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.server.should_exit = True
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise RuntimeError(f"the service did not stop within {timeout_s:.0f} s")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
