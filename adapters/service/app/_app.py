"""The ASGI app (Starlette): long-poll fetch, produce-and-wait, Prometheus metrics, health.

``create_app`` builds it; the handlers are :mod:`._routes`'.

Routes:

* ``GET /topics/{topic}/partitions/{partition}/records?offset=&max_wait_ms=&min_bytes=&max_bytes=``
  — long poll (Kafka's FetchRequest): answers once ``min_records`` (default 1) records, or
  ``min_bytes`` bytes, are there past ``offset``, or after ``max_wait_ms`` with what arrived.
  ``{"outcome": "COMPLETED"|"EXPIRED", "records": [...], "next_offset": n, ...}``. Without
  ``offset`` only new records count (it starts at the high watermark). Keys and values are
  UTF-8 text, or ``key_b64``/``value_b64`` when they are not.
* ``POST /topics/{topic}/records`` ``{"records": [{"value": "...", "key": "...", "partition": 0}],
  "timeout_ms": 30000}`` — produces with ``acks=all`` through the idempotent producer and answers
  once Kafka acknowledged every record (each in-sync replica has it, and there are at least
  ``min.insync.replicas``): 200 with per-partition ``NONE`` and each record's offset; else the
  first failure names the answer — 503 ``NOT_ENOUGH_REPLICAS`` (retry later), 413
  ``MESSAGE_TOO_LARGE``, 404 ``UNKNOWN_TOPIC_OR_PARTITION``, 504 ``REQUEST_TIMED_OUT`` (not
  acknowledged in time: it may still be written, once) — with every record's status, so a
  partly delivered request says which records made it. Leader changes and broker restarts
  within ``timeout_ms`` are retried by the producer, without duplicates or reordering.
* ``GET /topics/{topic}/replicated?offsets=p:o[,...]&epochs=p:e[,...]&records=p:o:t:d[,...]&timeout_ms=``
  — wait until offsets someone appended are on every in-sync replica (the high watermark passes
  them); with the leader epochs they were appended in (and each partition's first and last
  record — offset, timestamp, digest — to read back before NONE), a leader change since is
  answered 503 ``NOT_LEADER_OR_FOLLOWER`` instead of "replicated".
* ``GET /topics/{topic}/partitions/{partition}/stream?offset=`` — Server-Sent Events: the
  partition's records as they arrive, one event per batch, ``id`` the next offset; resumes from
  ``Last-Event-ID`` (:mod:`._stream_route`, :mod:`..stream`).
* ``GET /owners`` — the scale-out ownership group: members, their URLs and partitions.
* ``GET /metrics`` — Prometheus text: Kafka's purgatory metrics per purgatory
  (``..._PurgatorySize{delayedOperation="fetch"}``, ``NumDelayedOperations``, expirations), the
  operations' latency histogram, and the service's own (answers by status and error code, shared
  reads, change feed polls and health, Kafka reachability; :mod:`._metrics`).
* ``GET /healthz`` — 200 while serving, 503 before start and while draining; Kafka details
  (bootstrap servers, reachability) only for an authenticated client.

Errors are JSON ``{"error": CODE, "field": name, "message": why}`` with a 4xx status for the
client's mistakes (400 bad parameter or body, 401 not authenticated, 403 topic not allowed, 404
unknown topic/partition, 408 body not received in time, 413 body or record too large, 415 not
JSON, 416 offset out of range, 431 too many or too large header fields) and 503 when Kafka or the
purgatory cannot take it. No crafted request reaches a 500: what no route expected is still a
JSON 500 on a connection that stays usable (:class:`._guards.CatchAll`), and a bug.

Authentication (bearer tokens, mutual TLS) and the topic policy: :mod:`._auth`; request-head
limits and the catch-all: :mod:`._guards`; TLS and parser limits of uvicorn itself: :mod:`..server._server`.

Scale-out (``scaleout.enabled``, :mod:`..scaleout._scaleout`): a request for a partition owned by another
instance is answered 307 to it (or forwarded), 503 + Retry-After while it has no owner; an
operation whose partition moves while it waits is answered MOVED (307/303 to the new owner, or
503 + Retry-After and a relative Location).

A client that disconnects while waiting cancels its operation (finished CANCELLED, out of the
timer): abandoned long polls do not fill the purgatory.

With ``service.fast_long_poll`` (the default) the service's uvicorn protocol serves the long-poll
route itself, below this app, with this module's checks (:class:`LongPollRoute`,
:mod:`..http.h1._long_poll`): a waiting poll then holds no task; what it does not take comes here.
The app puts its endpoint into the lifespan state for the server's protocols, and warns once at
start when the server runs none of them (:mod:`._fast_paths`).

Lifespan: startup builds the :class:`Gateway` (its :class:`KafkaPurgatory`: change feed, clients,
purgatories); shutdown drains the purgatories (every waiting request is answered) and closes the
Kafka clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Route

from purgatory import configure_logging
from purgatory.metrics import register_metrics
from purgatory.settings import Settings, load_settings

from ...kafka import (
    check_client_config,
)
from ..answers._errors import RequestError
from ..answers._shared import SharedAnswers
from ..scaleout._scaleout import (
    ScaleOutCollector,
    release_on_shutdown,
)
from ._auth import Authenticator, RequireAuth, TopicPolicy
from ._fast_paths import ServerFastPaths
from ._gateway import Gateway, resolve_bootstrap
from ._guards import CatchAll, HeaderLimits, UnexpectedErrors
from ._long_poll_route import LongPollRoute
from ._metrics import Answers, CountAnswers, ServiceCollector
from ._routes import (
    await_replicated,
    fetch_records,
    healthz,
    http_error,
    metrics,
    owners,
    produce_records,
    request_error,
)
from ._stream_route import StreamCollector, stream_hub, stream_records

__all__ = ["LongPollRoute", "apply_log_settings", "create_app"]


def apply_log_settings(settings: Settings, *, override: bool) -> None:
    """Configure structlog from ``log.*``: always when ``override`` (a process of its own, such as
    ``serve``), else only when nobody configured it (an app inside someone else's process).

    Unconfigured, structlog renders to the console at DEBUG with rich tracebacks that show every
    frame's local variables: a malformed request cost 0.57 s of CPU and 56 KB of log that way.
    """
    if override or not structlog.is_configured():
        # force: configure_logging's once-flag may be left from a configuration reset since.
        configure_logging(settings.log.level, settings.log.format, force=True)


def create_app(settings: Settings | None = None, *, bootstrap_servers: str | None = None) -> Starlette:
    """The service as an ASGI app; settings are loaded at startup when not given.

    ``uvicorn --factory purgatory.adapters.service:create_app`` runs it with the environment's
    settings (``PURGATORY_*``, ``PURGATORY_CONFIG_FILE``); uvicorn's own limits and TLS then come
    from its command line, while :class:`..server._server.BackgroundServer` takes them from the settings.

    Raises :class:`ConfigError` / :class:`KafkaConfigError` at once for settings that could not
    serve a single request (no cluster named, a Kafka client property librdkafka refuses, a
    SASL mechanism it does not support): a clear error at start, not a failure of every request.
    """
    settings = settings if settings is not None else load_settings()
    check_client_config(settings.kafka, resolve_bootstrap(settings, bootstrap_servers))
    service = settings.service
    unexpected = UnexpectedErrors()
    authenticator = Authenticator(service)
    answers = Answers()  # by status and error code: the routes' (CountAnswers) and the fast paths'

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # log.* applies to however the service is started (uvicorn --factory, BackgroundServer,
        # serve): unless the host configured structlog already, as KafkaPurgatory.connect() does.
        apply_log_settings(settings, override=False)
        gateway = Gateway(settings, bootstrap_servers)
        # A large answer no connection holds any more leaves the rendered answers (._budget).
        gateway.answer_budget.on_release(app.state.rendered_fetches.forget)
        gateway.start()
        app.state.gateway = gateway
        app.state.stream_hub = hub = stream_hub(gateway)
        app.state.release = lambda: release_on_shutdown(gateway.scaleout)
        try:
            yield
        finally:
            app.state.gateway = None  # requests arriving now get 503, /healthz says unavailable
            hub.close()  # every event stream ends; its client resumes from its last id
            gateway.close()
            if gateway.scaleout is not None:
                await gateway.scaleout.aclose()

    fetch_route = Route("/topics/{topic}/partitions/{partition}/records", fetch_records, methods=["GET"])
    stream_route = Route("/topics/{topic}/partitions/{partition}/stream", stream_records, methods=["GET"])
    app = Starlette(
        routes=[
            fetch_route,
            stream_route,
            Route("/topics/{topic}/records", produce_records, methods=["POST"]),
            Route("/topics/{topic}/replicated", await_replicated, methods=["GET"]),
            Route("/owners", owners, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={RequestError: request_error, HTTPException: http_error},
        # Outermost first: limits before anything reads headers, authentication before routing,
        # the catch-all innermost, around the routes (outside them: Starlette's 500 + close).
        middleware=[
            Middleware(CountAnswers, answers=answers),  # outermost: every answer, refusals included
            Middleware(
                HeaderLimits,
                max_header_count=service.max_header_count,
                max_header_bytes=service.max_header_bytes,
            ),
            Middleware(RequireAuth, authenticator=authenticator),
            Middleware(CatchAll, errors=unexpected),
        ],
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.topic_policy = TopicPolicy(service)
    app.state.unexpected_errors = unexpected
    app.state.answers = answers
    app.state.rendered_fetches = SharedAnswers()
    # The long-poll route served below the ASGI app (._long_poll), with the checks above.
    # What the server hands its protocols (..http._endpoint): always, for HTTP/2's limits and budget.
    endpoint = LongPollRoute(app, fetch_route, authenticator, settings, service.fast_long_poll, stream_route)
    app.state.endpoint = endpoint
    # Outermost, lifespan only: the endpoint into the lifespan state for the server's protocols
    # (LongPollHttp), and the slow-path warning at start (._fast_paths).
    app.add_middleware(ServerFastPaths, endpoint=endpoint)
    app.state.long_poll = endpoint if service.fast_long_poll else None
    # One registry per app: the collectors read every live purgatory and the gateway at scrape time.
    app.state.registry = CollectorRegistry()
    register_metrics(app.state.registry)
    app.state.registry.register(ServiceCollector(lambda: getattr(app.state, "gateway", None), answers))
    app.state.registry.register(StreamCollector(lambda: getattr(app.state, "stream_hub", None)))
    app.state.registry.register(
        ScaleOutCollector(lambda: getattr(getattr(app.state, "gateway", None), "scaleout", None))
    )
    return app
