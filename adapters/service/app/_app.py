"""The ASGI app (Starlette): long-poll fetch, produce-and-wait, Prometheus metrics, health.

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

Lifespan: startup builds the :class:`Gateway` (its :class:`KafkaPurgatory`: change feed, clients,
purgatories); shutdown drains the purgatories (every waiting request is answered) and closes the
Kafka clients.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Coroutine, Iterable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any, TypeVar

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from purgatory import configure_logging
from purgatory.metrics import register_metrics
from purgatory.settings import Settings, load_settings

from ...kafka import (
    DelayedProduce,
    DelayedReplication,
    ErrorCode,
    check_client_config,
)
from ..answers._budget import AnswerBudget
from ..answers._errors import RequestError, from_validation_error
from ..answers._render import RenderedFetches, error_response, fetch_body_response
from ..scaleout._scaleout import (
    ScaleOut,
    ScaleOutCollector,
    parse_offsets,
    parse_record_identities,
    release_on_shutdown,
)
from ._auth import Authenticator, RequireAuth, TopicPolicy, is_authenticated
from ._gateway import Gateway, resolve_bootstrap
from ._guards import CatchAll, HeaderLimits, UnexpectedErrors
from ._long_poll_route import LongPollRoute
from ._metrics import Answers, CountAnswers, ServiceCollector
from ._requests import (
    MAX_PRODUCE_BODY_BYTES,
    MAX_PRODUCE_TIMEOUT_MS,
    ProduceRequest,
    _single_known_parameters,
    checked_partition,
    checked_topic,
    fetch_params,
)

__all__ = ["LongPollRoute", "apply_log_settings", "create_app"]

_TIMEOUT_MS = re.compile(r"[0-9]{1,10}")  # ASCII digits, as _PARTITION (then bounded by value)
MAX_LEADER_EPOCH = 2**31 - 1  # Kafka's int32 leader epoch
# What GET /topics/{topic}/replicated reads: anything else is a misspelling, refused as the long
# poll's query refuses one (FetchParams, extra="forbid"), not silently ignored.
_REPLICATED_PARAMETERS = frozenset({"offsets", "epochs", "records", "timeout_ms"})


T = TypeVar("T")
# nginx's "client closed request": logged by the server, never delivered to the departed client.
CLIENT_CLOSED_REQUEST = 499


def _gateway(request: Request) -> Gateway:
    gateway: Gateway | None = getattr(request.app.state, "gateway", None)
    if gateway is None or not gateway.serving:
        raise RequestError(503, "NOT_SERVING", None, "the service is starting or shutting down")
    return gateway


def _topic(request: Request) -> str:
    return checked_topic(str(request.path_params["topic"]), request.app.state.topic_policy)


def _partition(request: Request) -> int:
    return checked_partition(str(request.path_params["partition"]))


# A produce's failure names its answer: the first of these codes among its records.
_PRODUCE_FAILURES: tuple[tuple[ErrorCode, int], ...] = (
    (ErrorCode.MESSAGE_TOO_LARGE, 413),
    (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 404),
    (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 403),
    (ErrorCode.NOT_ENOUGH_REPLICAS, 503),
    (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, 503),
    (ErrorCode.UNKNOWN_SERVER_ERROR, 503),
    (ErrorCode.REQUEST_TIMED_OUT, 504),
)


def _produce_json(topic: str, op: DelayedProduce) -> tuple[int, dict[str, Any]]:
    """The answer of a produce: per partition and per record, what Kafka acknowledged."""
    result = op.result()
    body: dict[str, Any] = {
        "topic": topic,
        "outcome": result.outcome.name,
        "offsets": {str(k.partition): offset for k, offset in result.appended.items()},
        "statuses": {str(k.partition): s.value for k, s in result.statuses.items()},
        "records": [
            {"partition": partition, "offset": offset, "status": status.value}
            for partition, offset, status in zip(
                op.partitions, result.offsets, result.record_statuses, strict=True
            )
        ],
    }
    if result.succeeded:
        return 200, body
    codes = set(result.record_statuses)
    code, status = next(
        ((c, st) for c, st in _PRODUCE_FAILURES if c in codes), (ErrorCode.UNKNOWN_SERVER_ERROR, 503)
    )
    delivered, total = result.delivered, len(result.record_statuses)
    body |= {
        "error": code.value,
        "field": "records",  # each record's status is in "records"
        "message": (
            f"{delivered} of {total} record(s) acknowledged (acks=all); "
            + (
                "the others were not written"
                if code is not ErrorCode.REQUEST_TIMED_OUT
                else "the others were not acknowledged in time and may still be written, once"
            )
            + (f": {result.error}" if result.error is not None else "")
        ),
    }
    return status, body


def _replication_json(topic: str, op: DelayedReplication) -> tuple[int, dict[str, Any]]:
    """The answer of ``/replicated``: whether every in-sync replica has the offsets named."""
    statuses = {str(k.partition): (s.value if s is not None else None) for k, s in op.statuses.items()}
    body = {
        "topic": topic,
        "outcome": op.outcome.name if op.outcome is not None else None,
        "offsets": {str(k.partition): offset for k, offset in op.appended.items()},
        "statuses": statuses,
    }
    if op.succeeded:
        return 200, body
    codes = set(op.statuses.values())
    # The most telling failure names the answer: a leader change (the records may be lost),
    # too few in-sync replicas (retry later), else a timeout.
    code = next(
        (c for c in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS) if c in codes),
        ErrorCode.REQUEST_TIMED_OUT,
    )
    status = 504 if code is ErrorCode.REQUEST_TIMED_OUT else 503
    body |= {
        "error": code.value,
        "field": None,
        "message": "the offsets are not known to be replicated (not yet in the log, or not yet on every "
        "in-sync replica): " + ", ".join(f"{p}={s}" for p, s in statuses.items()),
    }
    return status, body


async def _disconnected(request: Request) -> None:
    """Return once the client has gone away (its request body was already read in full)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Await ``work`` in this task; if the client disconnects first, cancel it and return None.

    Cancelling the await of ``purgatory.watch`` finishes the operation as CANCELLED and takes it
    out of the timer, so an abandoned long poll does not occupy the purgatory until its
    ``max_wait_ms`` (the ASGI server does not cancel a handler whose client left).

    One extra task per request (the disconnect watcher), not two: ``work`` runs in the handler's
    own task, and the watcher cancels that task when the client leaves first. A waiting request
    costs one task and one coroutine chain less (``purgatory bench fanout``: memory per waiter
    and the answer time of 10,000 waiters). The watcher's callback cancels only while ``work`` is
    still awaited (``finished`` is set in the same step that ends the await), and ``uncancel``
    tells our cancellation from another one (uvicorn's graceful shutdown running out), which
    still propagates.
    """
    task = asyncio.current_task()
    assert task is not None, "called from a request handler's task"
    left = finished = False

    def on_watcher_done(watcher: asyncio.Future[None]) -> None:
        nonlocal left
        if not finished and not watcher.cancelled() and watcher.exception() is None:
            left = True
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(on_watcher_done)
    try:
        return await work  # its result, or its RequestError
    except asyncio.CancelledError:
        if left and task.uncancel() == 0:  # only the watcher's cancellation: the client left
            return None
        raise
    finally:
        finished = True
        watcher.cancel()


async def _routed(
    request: Request, scaleout: ScaleOut, topic: str, partitions: Iterable[int], body: bytes | None = None
) -> Response | None:
    """None to serve here; else the answer for another owner's partitions (307, 503, forwarded).

    A forwarded long poll is abandoned (499) when its client leaves, like one served here.
    """

    async def boxed() -> tuple[Response | None]:  # a 1-tuple: None inside means "serve here"
        return (await scaleout.elsewhere(request, topic, partitions, body),)

    routed = await _unless_disconnected(request, boxed())
    return Response(status_code=CLIENT_CLOSED_REQUEST) if routed is None else routed[0]


async def fetch_records(request: Request) -> Response:
    gateway = _gateway(request)
    topic, partition = _topic(request), _partition(request)
    params = fetch_params(request.query_params)
    started = time.monotonic()
    scaleout = gateway.scaleout
    if scaleout is not None:  # owned elsewhere: 307 / forwarded / 503 (see _scaleout)
        await gateway.partitions(topic)  # an unknown topic is a 404 here, not a wait for an owner
        elsewhere = await _routed(request, scaleout, topic, [partition])
        if elsewhere is not None:
            return elsewhere
    op = await _unless_disconnected(request, gateway.fetch(topic, partition, params))
    if op is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if op.moved is not None and scaleout is not None:
        default_wait = gateway.settings.kafka.fetch_max_wait_ms
        return scaleout.moved_fetch(request, op, started, default_wait)
    body = request.app.state.rendered_fetches.body(topic, partition, op)
    if len(body) <= _HELD_ANSWER_BYTES:
        return fetch_body_response(body)
    gateway.check_answer_fits(body)  # 429 MEMORY_BUDGET_EXCEEDED past the budget (._answer_budget)
    return _BudgetedResponse(body, gateway.answer_budget)


# Answers larger than this are counted in the answer budget while written (as the fast paths'
# answers written piece by piece: _long_poll.ANSWER_CHUNK).
_HELD_ANSWER_BYTES = 64 * 1024


class _BudgetedResponse(Response):
    """A long poll's 200 counted in the answer budget while it is written.

    uvicorn hands the body to its transport in one write and then waits while the transport's
    buffer is past its high-water mark: the copy a slow client leaves there is what is counted.
    """

    def __init__(self, body: bytes, budget: AnswerBudget) -> None:
        super().__init__(body, media_type="application/json")
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytes(self.body)  # the body given (bytes(b) is b)
        self.budget.take(body)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.budget.give_back(body)


async def produce_records(request: Request) -> Response:
    gateway = _gateway(request)
    topic = _topic(request)
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise RequestError(
            415, "INVALID_REQUEST", "content-type", f"expected application/json, got {content_type!r}"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_PRODUCE_BODY_BYTES:
        raise RequestError(
            413, "RECORD_LIST_TOO_LARGE", "body", f"body exceeds {MAX_PRODUCE_BODY_BYTES} bytes"
        )
    settings: Settings = request.app.state.settings
    body = await _read_body(request, settings.service.body_read_timeout_ms)
    document = _parse_json(body)
    try:
        produce = ProduceRequest.model_validate(document)
    except ValidationError as exc:
        raise from_validation_error(exc, where="body") from None
    # Served by any instance, scaled out or not: the partition's leader answers acks=all. No
    # disconnect watcher (a task per request, ~30 µs of the loop): a client that leaves does not
    # take its records back, and the wait is bounded by its timeout_ms anyway.
    op = await gateway.produce(topic, produce)
    status, payload = _produce_json(topic, op)
    return JSONResponse(payload, status_code=status)


async def await_replicated(request: Request) -> Response:
    """``GET /topics/{topic}/replicated?offsets=p:o[,...]&timeout_ms=``: wait until offsets someone
    appended are on every in-sync replica (see the module docstring)."""
    gateway = _gateway(request)
    topic = _topic(request)
    _single_known_parameters(request.query_params, _REPLICATED_PARAMETERS)
    offsets = parse_offsets(request.query_params.get("offsets"))
    raw_epochs = request.query_params.get("epochs")
    epochs = parse_offsets(raw_epochs, "epochs", MAX_LEADER_EPOCH) if raw_epochs is not None else None
    if epochs is not None and set(epochs) != set(offsets):
        raise RequestError(400, "INVALID_REQUEST", "epochs", "epochs must name the partitions of offsets")
    raw_records = request.query_params.get("records")
    records = parse_record_identities(raw_records) if raw_records is not None else None
    if records is not None and (epochs is None or set(records) != set(offsets)):
        raise RequestError(
            400,
            "INVALID_REQUEST",
            "records",
            "records must come with epochs and name the partitions of offsets",
        )
    raw_timeout = request.query_params.get("timeout_ms")
    if raw_timeout is not None and (
        _TIMEOUT_MS.fullmatch(raw_timeout) is None or int(raw_timeout) > MAX_PRODUCE_TIMEOUT_MS
    ):
        raise RequestError(
            400,
            "INVALID_REQUEST",
            "timeout_ms",
            f"timeout_ms must be an int from 0 to {MAX_PRODUCE_TIMEOUT_MS}, got {raw_timeout!r}",
        )
    timeout_ms = int(raw_timeout) if raw_timeout is not None else None
    started = time.monotonic()
    scaleout = gateway.scaleout
    if scaleout is not None:
        elsewhere = await _routed(request, scaleout, topic, offsets)
        if elsewhere is not None:
            return elsewhere
    op = await _unless_disconnected(
        request, gateway.await_replicated(topic, offsets, timeout_ms, epochs, records)
    )
    if op is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if op.moved is not None and scaleout is not None:
        moved = scaleout.moved_replication(
            topic, op, started, timeout_ms or gateway.settings.kafka.produce_timeout_ms
        )
        if moved is not None:
            return moved  # else its fence could not go along: answered here, NOT_LEADER_OR_FOLLOWER
    status, payload = _replication_json(topic, op)
    return JSONResponse(payload, status_code=status)


async def owners(request: Request) -> Response:
    """``GET /owners``: the ownership group — members, their URLs and partitions, this member's share."""
    gateway = _gateway(request)
    if gateway.scaleout is None:
        return JSONResponse(
            {"enabled": False, "message": "scale-out is off: this instance serves every partition"}
        )
    return JSONResponse(gateway.scaleout.owners_json())


async def _read_body(request: Request, timeout_ms: int) -> bytes:
    """The request body, at most ``MAX_PRODUCE_BODY_BYTES``, received in full within ``timeout_ms``.

    A client announcing more than it sends (Content-Length larger than the body, or a body
    trickled byte by byte) would otherwise hold the connection and this handler forever.
    """
    body = bytearray()
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            async for chunk in request.stream():  # bounded even when Content-Length is absent or wrong
                body += chunk
                if len(body) > MAX_PRODUCE_BODY_BYTES:
                    raise RequestError(
                        413, "RECORD_LIST_TOO_LARGE", "body", f"body exceeds {MAX_PRODUCE_BODY_BYTES} bytes"
                    )
    except ClientDisconnect:
        # The client left mid-body, or sent a body h11 refused (a bad chunk size: h11 answered
        # 400 and closed). The client's own doing, not a bug: no traceback, not counted by
        # CatchAll; the 499 is never delivered, only logged by the server.
        raise RequestError(
            CLIENT_CLOSED_REQUEST,
            "CLIENT_CLOSED_REQUEST",
            "body",
            f"the connection ended after {len(body)} body byte(s)",
        ) from None
    except TimeoutError:
        raise RequestError(
            408,
            "REQUEST_TIMEOUT",
            "body",
            f"{len(body)} body byte(s) received in {time.monotonic() - started:.1f} s; "
            f"the whole body must arrive within {timeout_ms} ms",
            # The rest of the body may still come: the connection cannot carry another request.
            headers={"Connection": "close"},
        ) from None
    return bytes(body)


def _parse_json(body: bytes) -> Any:
    """The body as JSON; a 400 naming ``body`` for anything that is not (including deep nesting).

    NaN and Infinity are parsed (as floats) so that the model refuses them *naming their field*;
    a lone surrogate parses to a Python str the model refuses the same way (``_requests``).
    """
    try:
        return json.loads(body)
    except RecursionError:
        # ~1000 levels of [ or { (the interpreter's recursion limit): no legal body nests past 3.
        raise RequestError(
            400, "INVALID_REQUEST", "body", "body is nested too deeply to be a produce request"
        ) from None
    except ValueError as exc:  # includes UnicodeDecodeError and integers of more than 4300 digits
        raise RequestError(400, "INVALID_REQUEST", "body", f"body is not valid JSON: {exc}") from None


async def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def healthz(request: Request) -> Response:
    gateway: Gateway | None = getattr(request.app.state, "gateway", None)
    if gateway is None or not gateway.serving:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    body: dict[str, Any] = {
        "status": "ok",
        "purgatories": {
            p.name: {"PurgatorySize": p.watched(), "NumDelayedOperations": p.num_delayed()}
            for p in gateway.purgatories
        },
    }
    if is_authenticated(request.scope):
        # Where the cluster is and what failed reaching it: for authenticated clients only.
        body["kafka"] = {
            "bootstrap_servers": gateway.bootstrap_servers,
            "unavailable": gateway.feed.unavailable,
        }
    return JSONResponse(body)


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no such route) and 405 (wrong method), in the service's JSON shape."""
    assert isinstance(exc, HTTPException)
    body = {"error": HTTPStatus(exc.status_code).name, "field": None, "message": str(exc.detail)}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


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
        gateway.start()
        app.state.gateway = gateway
        app.state.release = lambda: release_on_shutdown(gateway.scaleout)
        try:
            yield
        finally:
            app.state.gateway = None  # requests arriving now get 503, /healthz says unavailable
            gateway.close()
            if gateway.scaleout is not None:
                await gateway.scaleout.aclose()

    fetch_route = Route("/topics/{topic}/partitions/{partition}/records", fetch_records, methods=["GET"])
    app = Starlette(
        routes=[
            fetch_route,
            Route("/topics/{topic}/records", produce_records, methods=["POST"]),
            Route("/topics/{topic}/replicated", await_replicated, methods=["GET"]),
            Route("/owners", owners, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={RequestError: _request_error, HTTPException: _http_error},
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
    app.state.rendered_fetches = RenderedFetches()
    # The long-poll route served below the ASGI app (._long_poll), with the checks above.
    # What the server hands its protocols (..http._endpoint): always, for HTTP/2's limits and budget.
    endpoint = LongPollRoute(app, fetch_route, authenticator, settings, service.fast_long_poll)
    app.state.endpoint = endpoint
    app.state.long_poll = endpoint if service.fast_long_poll else None
    # One registry per app: the collectors read every live purgatory and the gateway at scrape time.
    app.state.registry = CollectorRegistry()
    register_metrics(app.state.registry)
    app.state.registry.register(ServiceCollector(lambda: getattr(app.state, "gateway", None), answers))
    app.state.registry.register(
        ScaleOutCollector(lambda: getattr(getattr(app.state, "gateway", None), "scaleout", None))
    )
    return app
