"""ServerFastPaths: the app tells its server's protocols where its endpoint is, and warns once at
start when the server has none of them.

The service's fast paths (the long poll served below the ASGI app over HTTP/1.1, and h2c) are
protocol classes of the server, not part of the app: ``purgatory serve`` (and
``python -m purgatory.adapters.service.serve``) and uvicorn's command line with
``--http purgatory.adapters.service:LongPollHttp`` run them; plain uvicorn (h11, httptools),
hypercorn or any other ASGI server run every request through the app — about 20 KB and a task per
waiting long poll, p99 seconds for a burst of 10,000 answers (docs/operations/running.md).

On the lifespan scope this middleware

* puts the app's :class:`...http._endpoint.LongPollEndpoint` into the lifespan state
  (:data:`...http._endpoint.ENDPOINT_STATE_KEY`): the server hands that dict to every protocol it
  makes (uvicorn's ``app_state``), which is how ``LongPollHttp`` gets the endpoint without looking
  into the app;
* once the startup completed, asks whether the server's protocol class is one of the service's
  (``serves_fast_paths``) and logs ``long_polls_on_slow_path`` once if not — with the command
  that runs the fast paths. uvicorn's lifespan ``receive`` is a method of its lifespan object,
  which holds the server's config and so its protocol class; any other server (or a uvicorn that
  no longer exposes it) counts as having none: a warning too many at worst, never one too few.

Nothing happens per request: HTTP scopes pass straight through.
"""

from __future__ import annotations

from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..http._endpoint import ENDPOINT_STATE_KEY, LongPollEndpoint

__all__ = ["FAST_COMMAND", "ServerFastPaths", "server_protocol_class"]

_log = structlog.get_logger("purgatory.service")

FAST_COMMAND = (
    "purgatory serve, or uvicorn --factory purgatory.adapters.service:create_app "
    "--http purgatory.adapters.service:LongPollHttp"
)


def server_protocol_class(receive: Receive) -> Any:
    """The HTTP protocol class of the uvicorn server running this lifespan (None: not known)."""
    lifespan = getattr(receive, "__self__", None)  # uvicorn's LifespanOn (receive is its method)
    config = getattr(lifespan, "config", None)
    return getattr(config, "http_protocol_class", None)


class ServerFastPaths:
    """Pure ASGI middleware (module docstring): endpoint into the lifespan state, warning at start."""

    def __init__(self, app: ASGIApp, endpoint: LongPollEndpoint) -> None:
        self.app = app
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        state = scope.get("state")
        if isinstance(state, dict):  # a server without lifespan state has no protocol to hand it
            state[ENDPOINT_STATE_KEY] = self.endpoint
        fast = bool(getattr(server_protocol_class(receive), "serves_fast_paths", False))

        async def send_then_warn(message: Message) -> None:
            await send(message)
            started = message["type"] == "lifespan.startup.complete"
            if started and not fast and self.endpoint.serves_long_polls:
                # After the startup: the lifespan applied log.* by now. Once per server start.
                _log.warning(
                    "long_polls_on_slow_path",
                    reason="this server runs none of the service's protocols: every long poll is an "
                    "ASGI task (~20 KB each) and HTTP/2 is not offered",
                    fast_path=FAST_COMMAND,
                )

        await self.app(scope, receive, send_then_warn)
