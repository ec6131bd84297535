"""The example service: an HTTP gateway over one KafkaPurgatory (Kafka's Fetch and Produce purgatories).

Run it (``service`` and ``kafka`` extras) against a cluster on its own server, which serves long
polls below the ASGI app and HTTP/2 beside HTTP/1.1 (the fast paths)::

    PURGATORY_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092 purgatory serve --host 127.0.0.1 --port 8080

(``python -m purgatory.adapters.service.serve`` is the same), or under uvicorn's command line
with the service's protocols, ``uvicorn --factory purgatory.adapters.service:create_app --http
purgatory.adapters.service:LongPollHttp``; or let ``purgatory run`` start a local Kafka, the
service, and a short exercise of both. Without ``--http`` uvicorn serves every request through
the ASGI app (no fast paths, no HTTP/2), and the app says so once at start.
See :mod:`.app._app` for the routes and :mod:`.app._gateway` for how requests become operations.
"""

from ..kafka.ops._off_loop_fetch import OffLoopFetch  # DelayedFetch's variants sit with it
from .answers._errors import RequestError
from .app._app import create_app
from .app._gateway import FETCH_PURGATORY, PRODUCE_PURGATORY, Gateway, resolve_bootstrap
from .app._requests import FetchParams, ProduceRecordIn, ProduceRequest
from .scaleout._redirect import Redirect, moved_answer, redirect_for
from .server._long_poll_http import LongPollHttp

__all__ = [
    "FETCH_PURGATORY",
    "PRODUCE_PURGATORY",
    "FetchParams",
    "Gateway",
    "LongPollHttp",
    "OffLoopFetch",
    "ProduceRecordIn",
    "ProduceRequest",
    "Redirect",
    "RequestError",
    "create_app",
    "moved_answer",
    "redirect_for",
    "resolve_bootstrap",
]
