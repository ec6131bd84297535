"""The HTTP/2 client of ``purgatory bench fanout --http2``: many long polls per h2c connection, read cheaply.

Why not the ``h2`` library: its client state machine (events, per-stream state, flow-control
managers) cost ~61 µs of the client's CPU per answer on this 2-core machine — twice the service's
own cost, on the same cores — so it, not the service, set the bench's p99 (docs/performance.md).
httpx (``http2=True``) is h2 underneath, holds at most 100 streams at once per connection in
httpcore, and reads a connection under one lock that a stream still waiting for its answer holds.

What this client is: one :class:`asyncio.Protocol` per connection (prior knowledge: the
connection preface, SETTINGS, then every request's HEADERS frame in one write), and a minimal
reader of what a server sends back (RFC 9113): 9-byte frame headers; HEADERS (padding and
priority stripped) with its CONTINUATIONs, the block decoded by the ``hpack`` library; DATA
(padding stripped) gathered per stream; SETTINGS and PING acknowledged; RST_STREAM and GOAWAY
ending the streams they end; other frames skipped. An answer counts when its stream ends
(END_STREAM on its HEADERS or last DATA): its status, its whole body and the time of the read
that carried the end are kept, as the HTTP/1.1 client keeps them.

Flow control (the client's receive side): the connection's window is opened wide once
(:data:`CONNECTION_WINDOW`, as browsers do) and topped up after every read by what that read's
DATA consumed; a stream's window (65,535) holds one answer, and a body larger than that has its
stream's window topped up per DATA frame. The service's own flow control (blocked answers,
WINDOW_UPDATE) is what tests/service/test_h2.py exercises with the ``h2`` library's client.

HPACK decoding is memoised per connection, and only where that is exact: a block decoded while
the connection's dynamic table was empty that left it empty and its size unchanged (the
service's blocks: static-table references and literals without indexing) decodes the same every
time it comes again in the same state, so its headers are kept by its bytes and reused while the
table stays empty. Anything else goes through the decoder every time.

tests/service/test_h2_bench_client.py checks the reader frame by frame against a server of the
``h2`` library, and against the ``h2`` library's own client on the real service.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import cast

import hpack

__all__ = ["H2LongPoll", "open_h2_long_polls"]

CONNECT_CONCURRENCY = 16  # connections being opened at once (each sends its streams in one write)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# The connection's receive window, opened once at the start: 1,000 answers of a few hundred bytes
# each would otherwise wait for a round trip per 64 KiB (the initial window) of them.
CONNECTION_WINDOW = 16 * 1024 * 1024
INITIAL_WINDOW = 65_535  # RFC 9113 §6.9.2: a stream's and the connection's, until changed
MEMOISED_BLOCKS = 64  # distinct header blocks kept decoded per connection (Date moves each second)

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
FRAME_HEADER = struct.Struct(">HBBBL")  # length (24 bits: 16 + 8), type, flags, R + stream id
FRAME_HEADER_BYTES = 9
STREAM_ID_MASK = 0x7FFF_FFFF
STATUS_RESET = -2  # the service reset the stream (RST_STREAM)
STATUS_CLOSED = -1  # the connection ended (or GOAWAY left the stream out) before its answer


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


class H2LongPoll:
    """One long poll on a stream: when, and with what, it was answered (as ``H1LongPoll``)."""

    __slots__ = ("answered_ns", "body", "partition", "status", "transport")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.status = 0
        self.body = b""
        self.answered_ns = 0
        self.transport: asyncio.Transport | None = None  # its connection's, closed by the bench

    def close(self) -> None:
        """Close its connection (shared with the connection's other streams: closing twice is a no-op)."""
        if self.transport is not None:
            self.transport.close()


class _H2Connection(asyncio.Protocol):
    """One h2c connection carrying ``len(requests)`` long polls; ``sent`` once all were written.

    Stream ``2 i + 1`` is request ``i``. ``_pending`` holds the bytes of a frame split across
    reads; ``_block`` a header block awaiting its CONTINUATIONs (its stream, END_STREAM, bytes).
    """

    def __init__(
        self, authority: bytes, requests: list[tuple[bytes, H2LongPoll]], keep_bodies: bool = True
    ) -> None:
        self.authority = authority
        self.requests = requests
        # False: bodies are read and thrown away (tools/bench/service/min_bytes_flood: 16 MiB answers by
        # the thousand); a poll keeps its status and its body's last DATA frame only.
        self.keep_bodies = keep_bodies
        self.by_stream: dict[int, H2LongPoll] = {}
        self.statuses: dict[int, int] = {}  # stream -> status, from its HEADERS until it ends
        self.bodies: dict[int, bytearray] = {}  # stream -> body so far, when it came in pieces
        self.decoder = hpack.Decoder()
        self.decoded: dict[bytes, int] = {}  # block -> its :status, for blocks exact to reuse (module doc)
        self.transport: asyncio.Transport | None = None
        self.goaway_last_stream: int | None = None
        self._pending = b""
        self._block: tuple[int, int, bytearray] | None = None
        self.sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- requests ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        encoder = hpack.Encoder()
        out = [
            PREFACE,
            _frame(SETTINGS, 0, 0),  # the defaults: no push is ever asked for by a GET
            _frame(WINDOW_UPDATE, 0, 0, (CONNECTION_WINDOW - INITIAL_WINDOW).to_bytes(4, "big")),
        ]
        for i, (path, poll) in enumerate(self.requests):
            stream_id = 2 * i + 1
            block = encoder.encode(
                [
                    (b":method", b"GET"),
                    (b":scheme", b"http"),
                    (b":authority", self.authority),
                    (b":path", path),
                ]
            )
            out.append(_frame(HEADERS, END_STREAM | END_HEADERS, stream_id, block))
            poll.transport = self.transport
            self.by_stream[stream_id] = poll
        self.transport.write(b"".join(out))
        self.sent.set_result(None)

    # -- answers -------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self._pending:
            data = self._pending + data
        unpack = FRAME_HEADER.unpack_from
        at, end = 0, len(data)
        consumed = 0  # DATA payload bytes of this read: given back to the connection's window
        replies: list[bytes] = []
        while end - at >= FRAME_HEADER_BYTES:
            high, low, kind, flags, stream_id = unpack(data, at)
            length = high << 8 | low
            start = at + FRAME_HEADER_BYTES
            stop = start + length
            if stop > end:
                break  # the rest of this frame comes with the next read
            at = stop
            stream_id &= STREAM_ID_MASK
            if kind == DATA:
                consumed += length
                if flags & PADDED:
                    stop -= data[start]
                    start += 1
                if flags & END_STREAM:
                    self._ended(stream_id, data[start:stop], now)
                else:
                    if self.keep_bodies:
                        self.bodies.setdefault(stream_id, bytearray()).extend(data[start:stop])
                    if length:  # give the stream's window back: a body larger than one window
                        replies.append(_frame(WINDOW_UPDATE, 0, stream_id, length.to_bytes(4, "big")))
            elif kind == HEADERS:
                if flags & PADDED:
                    stop -= data[start]
                    start += 1
                if flags & PRIORITY:
                    start += 5  # stream dependency (4) and weight (1)
                if flags & END_HEADERS:
                    self._headers(stream_id, data[start:stop], bool(flags & END_STREAM), now)
                else:
                    self._block = (stream_id, flags & END_STREAM, bytearray(data[start:stop]))
            elif kind == CONTINUATION:
                block = self._block
                if block is None or block[0] != stream_id:
                    raise ConnectionError(f"CONTINUATION on stream {stream_id} without its HEADERS")
                block[2].extend(data[start:stop])
                if flags & END_HEADERS:
                    self._block = None
                    self._headers(stream_id, bytes(block[2]), bool(block[1]), now)
            elif kind == SETTINGS:
                if not flags & ACK:
                    replies.append(_frame(SETTINGS, ACK, 0))
            elif kind == PING:
                if not flags & ACK:
                    replies.append(_frame(PING, ACK, 0, data[start:stop]))
            elif kind == RST_STREAM:
                self._unanswered(stream_id, STATUS_RESET, now)
            elif kind == GOAWAY:
                last = int.from_bytes(data[start : start + 4], "big") & STREAM_ID_MASK
                self.goaway_last_stream = last
                for later in [s for s in self.by_stream if s > last]:
                    self._unanswered(later, STATUS_CLOSED, now)  # never processed: will not be answered
            # WINDOW_UPDATE (nothing of ours waits for window), PRIORITY, unknown types: skipped.
        self._pending = data[at:]
        if consumed:
            replies.append(_frame(WINDOW_UPDATE, 0, 0, consumed.to_bytes(4, "big")))
        if replies and self.transport is not None:
            self.transport.write(b"".join(replies))

    def _headers(self, stream_id: int, block: bytes, end_stream: bool, now: int) -> None:
        status = self._status(block)
        if stream_id not in self.by_stream:
            return  # not a stream of ours (the block was still decoded: HPACK state is per connection)
        if status < 200:
            return  # an informational answer (1xx): the final one follows
        if stream_id in self.statuses:
            if end_stream:  # trailers after the body
                self._ended(stream_id, b"", now)
            return
        self.statuses[stream_id] = status
        if end_stream:
            self._ended(stream_id, b"", now)

    def _status(self, block: bytes) -> int:
        """The block's ``:status`` (0 if none), decoded by ``hpack`` or reused (module docstring)."""
        table = self.decoder.header_table
        if not table.dynamic_entries:
            status = self.decoded.get(block)
            if status is not None:
                return status
            size = table.maxsize
            headers = self.decoder.decode(block, raw=True)
            status = _status_of(headers)
            if not table.dynamic_entries and table.maxsize == size:
                if len(self.decoded) >= MEMOISED_BLOCKS:
                    self.decoded.clear()
                self.decoded[block] = status
            return status
        return _status_of(self.decoder.decode(block, raw=True))

    def _ended(self, stream_id: int, last: bytes, now: int) -> None:
        poll = self.by_stream.get(stream_id)
        if poll is None or poll.answered_ns:
            return
        pieces = self.bodies.pop(stream_id, None)
        poll.body = bytes(pieces + last) if pieces is not None else last
        poll.status = self.statuses.pop(stream_id, 0)  # set once the answer is whole
        poll.answered_ns = now

    def _unanswered(self, stream_id: int, status: int, now: int) -> None:
        poll = self.by_stream.get(stream_id)
        if poll is not None and not poll.answered_ns:
            poll.status, poll.answered_ns = status, now

    def connection_lost(self, exc: Exception | None) -> None:
        now = time.monotonic_ns()
        for poll in self.by_stream.values():
            if not poll.answered_ns:
                poll.status, poll.answered_ns = STATUS_CLOSED, now  # closed without an answer


def _status_of(headers: object) -> int:
    for name, value in cast(list[tuple[bytes, bytes]], headers):
        if name == b":status":
            return int(value)
    return 0


async def open_h2_long_polls(
    port: int,
    topic: str,
    waiters: int,
    partitions: int,
    max_wait_ms: int,
    streams_per_connection: int,
    offset: int = 0,
    extra_query: str = "",
    keep_bodies: bool = True,
) -> list[H2LongPoll]:
    """``waiters`` long polls at ``offset`` (waiter ``i`` on partition ``i % partitions``) over h2c
    connections; ``extra_query`` is appended to each query (``&min_bytes=...``)."""
    loop = asyncio.get_running_loop()
    polls = [H2LongPoll(i % partitions) for i in range(waiters)]
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def open_one(first: int) -> None:
        chunk = polls[first : first + streams_per_connection]
        requests = [
            (
                f"/topics/{topic}/partitions/{p.partition}/records?offset={offset}&max_wait_ms={max_wait_ms}{extra_query}".encode(),
                p,
            )
            for p in chunk
        ]
        async with gate:
            _, protocol = await loop.create_connection(
                lambda: _H2Connection(b"127.0.0.1", requests, keep_bodies), "127.0.0.1", port
            )
            await protocol.sent

    await asyncio.gather(*(open_one(i) for i in range(0, waiters, streams_per_connection)))
    return polls
