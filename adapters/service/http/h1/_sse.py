"""SseConnection: an event stream served below the ASGI app, a connection of its own protocol.

Why: through uvicorn and Starlette a stream is a task with a chain of coroutines, a queue and
h11's state per connection (~21 KB per waiting connection, measured on the long poll); 10,000
browsers on one partition would hold 200 MB for doing nothing. Here, once the HTTP/1.1 protocol
(:class:`._long_poll.LongPollH11Protocol`) has read a ``GET .../stream`` head and the app's checks
passed (:meth:`...http._endpoint.LongPollEndpoint.checked_stream`: authentication, topic policy,
partition, query, admission), the connection is handed over (:func:`hand_over_stream`): the
transport gets this small protocol instead, uvicorn's protocol, its h11 state and its timers are
let go, and the hub (:class:`...stream.StreamHub`) writes the partition's events straight to the
transport, the same bytes to every stream at the same position.

The response is ``200`` with ``Connection: close`` and no length: its body runs until the
connection closes (RFC 9112 §6.3), so an event is written as rendered, without chunk framing.

Write back-pressure: the transport's high-water mark is the stream's buffer
(``service.stream_buffer_bytes``). Bytes the client has not read yet stay in the transport's
buffer; an event that would take it past the bound is not written: the stream ends with
``event: overflow`` at that event's offset (its ``id``: where the client's reconnection resumes).
A paused transport receives no event: it is already at the bound.

Concurrency contract: the event loop's thread only, as every asyncio protocol.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog
from starlette.responses import JSONResponse, Response
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES

from ...answers._errors import UNEXPECTED_ERROR_BODY, RequestError
from ...answers._render import error_response
from ...stream import StreamSink, overflow_event
from ...stream._framing import retry_field
from .._endpoint import CheckedStream, LongPollEndpoint
from .._fanout_writes import fanout_writes

if TYPE_CHECKING:
    from ._long_poll import LongPollH11Protocol

__all__ = ["SseConnection", "hand_over_stream"]

_log = structlog.get_logger("purgatory.service")

# The head of a stream's 200 after uvicorn's default headers (date, server): no length, the body
# runs until the connection closes; no caching; no buffering by nginx-like proxies.
_STREAM_HEAD = (
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"x-accel-buffering: no\r\n"
    b"connection: close\r\n\r\n"
)


def stream_head(default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The status line and header fields of a stream's 200."""
    head = [b"HTTP/1.1 200 OK\r\n"]
    head += [b"%s: %s\r\n" % header for header in default_headers]
    return b"".join(head) + _STREAM_HEAD


class SseConnection(asyncio.Protocol, StreamSink):
    """One event stream's connection (module docstring): the hub's sink and the transport's protocol.

    Registered in uvicorn's ``server_state.connections`` (its graceful shutdown calls
    :meth:`shutdown`, which ends the stream; the client resumes from its last id).
    """

    __slots__ = ("buffer_bytes", "checked", "connections", "endpoint", "hub", "opening", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        checked: CheckedStream,
        endpoint: LongPollEndpoint,
        connections: set[Any],
    ) -> None:
        StreamSink.__init__(self)
        self.transport = transport
        self.checked: CheckedStream | None = checked  # until the stream started
        self.hub = checked.hub
        self.endpoint = endpoint
        self.connections = connections
        self.buffer_bytes = checked.buffer_bytes
        self.opening: asyncio.Task[None] | None = None

    # -- the hub's sink --------------------------------------------------------------------------

    def send(self, event: bytes, offset: int) -> bool:
        writes: list[tuple[Any, bytes]] = []
        if not self.stage(event, offset, writes):
            return False
        for transport, data in writes:
            transport.write(data)
        return True

    def stage(self, event: bytes, offset: int, writes: list[tuple[Any, bytes]]) -> bool:
        """The event's write left to the hub's ``write_all`` (made with its group's others); an
        overflow is written here, and the stream ends."""
        transport = self.transport
        if transport.is_closing():
            return False  # connection_lost lets go of it
        pending = transport.get_write_buffer_size()
        if pending and pending + len(event) > self.buffer_bytes:
            transport.write(overflow_event(offset, self.buffer_bytes))
            transport.close()  # what is buffered still goes out, then the connection closes
            return False
        writes.append((transport, event))
        return True

    def finish(self, last: bytes) -> None:
        if not self.transport.is_closing():
            if last:
                self.transport.write(last)
            self.transport.close()

    # -- the stream's start ---------------------------------------------------------------------

    def start_waiting(self, default_headers: list[tuple[bytes, bytes]]) -> bool:
        """Start at once, joining a group already waiting at the stream's offset (the common case:
        thousands of streams at a partition's end); False: :meth:`start` it (one poll first)."""
        checked = self.checked
        assert checked is not None, "a stream starts once"
        offset = checked.hub.join_waiting(self, checked.topic, checked.partition, checked.offset)
        if offset is None:
            return False
        self.checked = None
        self._write_head(default_headers, checked.retry_ms, b"")
        return True

    async def start(self, default_headers: list[tuple[bytes, bytes]]) -> None:
        """One long poll that does not wait (the hub's start), then the 200 and the stream's events."""
        checked = self.checked
        assert checked is not None, "a stream starts once"
        self.checked = None
        hub = checked.hub
        try:
            next_offset, first = await hub.start(checked.topic, checked.partition, checked.offset)
        except RequestError as exc:
            self._refuse(error_response(exc), default_headers)
            return
        except Exception:  # a bug: as the app's catch-all, a JSON 500 (then closed)
            self.endpoint.count_unexpected_error()
            _log.exception("stream_start_failed", topic=checked.topic, partition=checked.partition)
            self._refuse(JSONResponse(UNEXPECTED_ERROR_BODY, status_code=500), default_headers)
            return
        if self.transport.is_closing():
            return
        self._write_head(default_headers, checked.retry_ms, first or b"")
        hub.join(self, checked.topic, checked.partition, next_offset)
        self.opening = None

    def _write_head(self, default_headers: list[tuple[bytes, bytes]], retry_ms: int, first: bytes) -> None:
        head = stream_head(default_headers)
        self.endpoint.count_http11(head)
        self.transport.write(head + retry_field(retry_ms) + first)

    def _refuse(self, response: Response, default_headers: list[tuple[bytes, bytes]]) -> None:
        if self.transport.is_closing():
            return
        head = [b"HTTP/1.1 %d %s\r\n" % (response.status_code, STATUS_PHRASES[response.status_code])]
        head += [b"%s: %s\r\n" % h for h in (*default_headers, *response.raw_headers)]
        data = b"".join(head) + b"connection: close\r\n\r\n" + bytes(response.body)
        self.endpoint.count_http11(data)
        self.transport.write(data)
        self.transport.close()

    # -- the connection -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        # A stream's client has nothing more to say: what it sends (a pipelined request) is not
        # read, and not kept either; reading pauses so a client cannot make it a flood.
        self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return False  # the client's half-close: close ours too

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        opening = self.opening
        if opening is not None and not opening.done():
            opening.cancel()  # its start's poll is finished CANCELLED
        self.hub.leave(self)  # idempotent: a stream that ended already waits in no group
        # Its socket's close (the kernel's FIN) goes to a thread, off the loop (_fanout_writes).
        fanout_writes(asyncio.get_running_loop()).close_later(self.transport)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: the stream ends now (its client resumes from its last id)."""
        self.transport.close()


def hand_over_stream(
    protocol: LongPollH11Protocol, endpoint: LongPollEndpoint, scope: dict[str, Any]
) -> bool:
    """Take ``scope``'s event stream off ``protocol``'s connection (module docstring); False: the app's."""
    checked = endpoint.checked_stream(scope)
    if checked is None:
        return False
    transport = protocol.transport
    connections = protocol.server_state.connections
    # uvicorn's protocol lets go of the connection: no timers, not in the server's set.
    protocol._disarm_head_timer()
    keep_alive = protocol.timeout_keep_alive_task
    if keep_alive is not None:
        keep_alive.cancel()
        protocol.timeout_keep_alive_task = None
    connections.discard(protocol)
    stream = SseConnection(transport, checked, endpoint, connections)
    connections.add(stream)  # type: ignore[arg-type]  # uvicorn calls shutdown() only
    transport.set_protocol(stream)
    # The high-water mark is the stream's bound: a paused transport holds a full buffer.
    transport.set_write_buffer_limits(high=checked.buffer_bytes)
    default_headers = protocol.server_state.default_headers
    if not stream.start_waiting(default_headers):
        stream.opening = protocol.loop.create_task(stream.start(default_headers))
    return True
