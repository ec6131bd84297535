"""The event-stream route, ``GET /topics/{topic}/partitions/{partition}/stream`` (Server-Sent Events).

A partition's records as they arrive, one event per batch (:mod:`..stream`): ``?offset=`` starts
there (default: the end, new records only), ``Last-Event-ID`` (an ``EventSource`` reconnecting)
resumes from the id of the last event received. Same checks as the long poll, in the same order:
authentication (the middleware), the topic policy, the partition, the query, admission (a stream
counts as a waiter), then one long poll that does not wait (404 unknown topic, 416 offset out of
range) — all answered as the long poll answers them, before the stream's 200.

This is the ASGI path: a :class:`StreamingResponse` fed by a :class:`QueueSink`. The service's
own HTTP/1.1 protocol serves the same route below the app (:mod:`..http.h1._sse`), far cheaper
per stream; both are fed by the app's one :class:`StreamHub`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import Field
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ...kafka import DelayedFetch
from ...kafka.facts._keys import partition_key
from ..answers._errors import RequestError
from ..http._fanout_writes import fanout_writes
from ..stream import StreamHub, StreamSink, overflow_event, resume_offset
from ..stream._framing import LAST_EVENT_ID, retry_field
from ._gateway import Gateway
from ._requests import MAX_OFFSET, FetchParams, QueryInt, _Strict, query_params
from ._routes import _gateway, _partition, _topic  # the long poll's own checks

__all__ = [
    "EVENT_STREAM_HEADERS",
    "GatewayStreams",
    "QueueSink",
    "StreamCollector",
    "StreamParams",
    "stream_params",
    "stream_records",
]

# Headers of a stream's 200: no caching, and no buffering by nginx-like proxies (X-Accel-Buffering).
EVENT_STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
EVENT_STREAM_TYPE = "text/event-stream; charset=utf-8"


class StreamParams(_Strict):
    """Query of ``GET /topics/{topic}/partitions/{p}/stream``."""

    offset: QueryInt | None = Field(
        None, ge=0, le=MAX_OFFSET, description="First offset to stream; omitted: the end (new records only)."
    )


def stream_params(query: QueryParams) -> StreamParams:
    """The stream's query as :class:`StreamParams`, else a 400 naming the first bad field."""
    return query_params(StreamParams, query)


def start_offset(headers: list[tuple[bytes, bytes]], query: QueryParams) -> int | None:
    """Where the stream starts: ``Last-Event-ID`` before ``?offset=`` (:func:`resume_offset`)."""
    last_id = next((value for name, value in headers if name.lower() == LAST_EVENT_ID), None)
    return resume_offset(last_id, stream_params(query).offset)


class GatewayStreams:
    """The gateway as the hub's :class:`StreamWaits`: its long poll and its waiters' count."""

    __slots__ = ("gateway",)

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @property
    def serving(self) -> bool:
        return self.gateway.serving

    async def fetch_from(
        self, topic: str, partition: int, offset: int | None, max_wait_ms: int
    ) -> DelayedFetch:
        # The long poll of ?offset=&max_wait_ms=, clamped and admitted as any long poll.
        return await self.gateway.fetch(topic, partition, FetchParams(offset=offset, max_wait_ms=max_wait_ms))

    def known_end(self, topic: str, partition: int) -> int | None:
        return self.gateway.metadata.known_high_watermark(partition_key(topic, partition))

    def waiters(self) -> int:
        return self.gateway.waiting_requests()  # long polls by waiter: equal ones share one operation


def stream_hub(gateway: Gateway) -> StreamHub:
    """The app's one hub over ``gateway`` (built with it, in the lifespan)."""
    settings = gateway.settings
    admission = settings.admission
    return StreamHub(
        GatewayStreams(gateway),
        heartbeat_ms=settings.service.stream_heartbeat_ms,
        max_streams=admission.max_waiters,
        max_streams_per_key=admission.max_waiters_per_key,
        retry_after_s=admission.retry_after_s,
        write_all=_fanout_write,
    )


def _fanout_write(writes: list[tuple[Any, bytes]]) -> None:
    """A group's event to its streams' transports, the sends shared among threads."""
    fanout_writes(asyncio.get_running_loop()).write(writes)


class QueueSink(StreamSink):
    """A stream of the ASGI path: its events queued for the response's iterator, at most
    ``buffer_bytes`` of them (past it: ``event: overflow`` and the stream ends)."""

    __slots__ = ("buffer_bytes", "done", "pending", "pending_bytes", "ready")

    def __init__(self, buffer_bytes: int) -> None:
        super().__init__()
        self.buffer_bytes = buffer_bytes
        self.pending: deque[bytes] = deque()
        self.pending_bytes = 0
        self.done = False
        self.ready = asyncio.Event()

    def send(self, event: bytes, offset: int) -> bool:
        if self.done:
            return False
        if self.pending_bytes and self.pending_bytes + len(event) > self.buffer_bytes:
            self.finish(overflow_event(offset, self.buffer_bytes))
            return False
        self.pending.append(event)
        self.pending_bytes += len(event)
        self.ready.set()
        return True

    def finish(self, last: bytes) -> None:
        if last:
            self.pending.append(last)
        self.done = True
        self.ready.set()

    async def events(self) -> AsyncIterator[bytes]:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.pending:
                event = self.pending.popleft()
                self.pending_bytes -= len(event)
                yield event
            if self.done:
                return


async def stream_records(request: Request) -> Response:
    """``GET .../stream``: checks, admission, the first position, then events until the client leaves."""
    gateway = _gateway(request)
    topic, partition = _topic(request), _partition(request)
    offset = start_offset(request.scope["headers"], request.query_params)
    if request.scope.get("http_version") == "2":
        # The HTTP/2 bridge (..http.h2._bridge) sends an answer once it is complete: a stream never is.
        raise RequestError(
            505, "HTTP_VERSION_NOT_SUPPORTED", None, "event streams are served over HTTP/1.1, not HTTP/2"
        )
    if gateway.scaleout is not None:
        raise RequestError(
            501,
            "NOT_IMPLEMENTED",
            None,
            "event streams are not served with scaleout.enabled (use long polls)",
        )
    hub: StreamHub = request.app.state.stream_hub
    hub.admit(topic, partition)
    next_offset, first = await hub.start(topic, partition, offset)
    service = gateway.settings.service
    sink = QueueSink(service.stream_buffer_bytes)

    async def body() -> AsyncIterator[bytes]:
        try:
            yield retry_field(service.stream_retry_ms) + (first or b"")
            hub.join(sink, topic, partition, next_offset)
            async for event in sink.events():
                yield event
        finally:
            hub.leave(sink)

    return StreamingResponse(body(), media_type=EVENT_STREAM_TYPE, headers=EVENT_STREAM_HEADERS)


class StreamCollector(Collector):
    """Open event streams and the events rendered for them (each written to a whole group)."""

    def __init__(self, hub: Callable[[], StreamHub | None]) -> None:
        self._hub = hub

    def collect(self) -> Iterator[Metric]:
        hub = self._hub()
        if hub is None:
            return
        streams = GaugeMetricFamily("purgatory_service_event_streams", "Event streams open (GET .../stream).")
        streams.add_metric([], hub.streams)
        events = CounterMetricFamily(
            "purgatory_service_stream_events",
            "Events rendered for streams (each written to every stream waiting at its offset).",
        )
        events.add_metric([], hub.events)
        yield from (streams, events)
