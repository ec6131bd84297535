"""LongPollHttp: the service's protocols for uvicorn's own command line (``--http``).

uvicorn's ``--http`` takes an import string of a protocol class besides its names (``h11``,
``httptools``): ``Config.load`` imports ``HTTP_PROTOCOLS.get(http, http)``, and the server calls
the class with ``config``, ``server_state``, ``app_state`` and ``_loop`` for every connection. So

    uvicorn --factory purgatory.adapters.service:create_app \\
        --http purgatory.adapters.service:LongPollHttp

serves long polls and h2c on the fast paths, as ``purgatory serve`` does. The class cannot be
made from the settings beforehand (uvicorn imports it by name), so it is made at the first
connection from what the app's lifespan put into the lifespan state — uvicorn hands every
protocol that very dict as ``app_state``: the app's :class:`LongPollEndpoint`
(:data:`..http._endpoint.ENDPOINT_STATE_KEY`), whose settings give the rest
(:func:`._server.uvicorn_options`: the head-read timeout, fast long polls, HTTP/2). The class made
is kept in the same state (one per server, as ``serve`` makes one per server), and every
connection is an instance of it: nothing per connection is added for this indirection.

Without an endpoint in the state (another app, or ``--lifespan off``), connections get the
service's HTTP/1.1 protocol with no fast path: every request goes through the app.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from ..http._endpoint import endpoint_in_state
from ..http.h1._head_timeout import head_timeout_protocol
from ..settings import ServiceSettings
from ._server import uvicorn_options

__all__ = ["PROTOCOL_STATE_KEY", "LongPollHttp"]

# Where the protocol class made for this server's app is kept (the lifespan state: per server).
PROTOCOL_STATE_KEY = "purgatory.http_protocol"


class LongPollHttp:
    """A uvicorn ``--http`` class whose instances are the service's protocols (module docstring).

    ``LongPollHttp(config=..., server_state=..., app_state=...)`` returns a connection of the class
    :func:`protocol_for_state` makes from ``app_state``, not an instance of this class.
    """

    serves_fast_paths = True  # read by the app's lifespan (it warns when its server has none)

    def __new__(  # type: ignore[misc]  # returns the connection's real protocol (class docstring)
        cls,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> asyncio.Protocol:
        protocol: type[asyncio.Protocol] = protocol_for_state(app_state)
        return protocol(config=config, server_state=server_state, app_state=app_state, _loop=_loop)  # type: ignore[call-arg]


def protocol_for_state(app_state: dict[str, Any]) -> type[asyncio.Protocol]:
    """The protocol class for the app whose lifespan state ``app_state`` is; made once per state."""
    protocol: type[asyncio.Protocol] | None = app_state.get(PROTOCOL_STATE_KEY)
    if protocol is None:
        endpoint = endpoint_in_state(app_state)
        if endpoint is None:
            # Not our app: uvicorn's h11 with the default bound on a request head's time.
            default_ms = ServiceSettings.model_fields["head_read_timeout_ms"].default
            protocol = head_timeout_protocol(default_ms / 1000.0)
        else:
            protocol = uvicorn_options(endpoint.settings.service, endpoint)["http"]
        app_state[PROTOCOL_STATE_KEY] = protocol
    return protocol
