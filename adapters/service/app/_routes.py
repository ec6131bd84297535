"""The routes of the service's ASGI app: long-poll fetch, produce-and-wait, replicated, owners,
metrics and health, with the JSON of their answers and the error handlers.

What each route answers is in :mod:`._app`'s docstring; :func:`._app.create_app` mounts them.
The long-poll route's answer is rendered by :mod:`..answers._render` (shared with the protocols'
fast paths); the checks of a path and a query are :mod:`._requests`'.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Coroutine, Iterable
from http import HTTPStatus
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from purgatory.settings import Settings

from ...kafka import (
    DelayedProduce,
    DelayedReplication,
    ErrorCode,
)
from ..answers._budget import AnswerBudget
from ..answers._errors import RequestError, from_validation_error
from ..answers._render import error_response, fetch_body_response
from ..scaleout._scaleout import (
    ScaleOut,
    parse_offsets,
    parse_record_identities,
)
from ._auth import is_authenticated
from ._gateway import Gateway
from ._requests import (
    MAX_PRODUCE_BODY_BYTES,
    MAX_PRODUCE_TIMEOUT_MS,
    ProduceRequest,
    _single_known_parameters,
    checked_partition,
    checked_topic,
    fetch_params,
)

__all__ = [
    "await_replicated",
    "fetch_records",
    "healthz",
    "http_error",
    "metrics",
    "owners",
    "produce_records",
    "request_error",
]

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

    Over HTTP/1.1 the body goes out :data:`_HELD_ANSWER_BYTES` at a time: uvicorn waits before
    each piece while its transport's buffer is past the high-water mark, so the connection holds
    one piece beyond the shared body. In one message, h11 made the body into a new ``bytes`` and
    the transport kept what the socket did not take as one more copy: three ~18 MB copies of
    issue 31's replay answer (a cold service's first long poll goes this way: the fast path
    takes polls once the partition's metadata is cached), the cold round's peak of +58 MB. The
    HTTP/2 bridge keeps a one-message body as it is (a piece at a time would be a copy per stream).
    """

    def __init__(self, body: bytes, budget: AnswerBudget) -> None:
        super().__init__(body, media_type="application/json")
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytes(self.body)  # the body given (bytes(b) is b)
        self.budget.take(body)
        try:
            if scope.get("http_version") not in ("1.0", "1.1"):
                await super().__call__(scope, receive, send)
                return
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            size = len(body)
            for start in range(0, size, _HELD_ANSWER_BYTES):
                end = start + _HELD_ANSWER_BYTES
                await send({"type": "http.response.body", "body": body[start:end], "more_body": end < size})
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
        # Requests waiting in the fetch purgatory's groups (it counts one operation per group).
        "long_poll_waiters": gateway.long_poll_waiters,
    }
    if is_authenticated(request.scope):
        # Where the cluster is and what failed reaching it: for authenticated clients only.
        body["kafka"] = {
            "bootstrap_servers": gateway.bootstrap_servers,
            "unavailable": gateway.feed.unavailable,
        }
    return JSONResponse(body)


async def request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return error_response(exc)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no such route) and 405 (wrong method), in the service's JSON shape."""
    assert isinstance(exc, HTTPException)
    body = {"error": HTTPStatus(exc.status_code).name, "field": None, "message": str(exc.detail)}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
