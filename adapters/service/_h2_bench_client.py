"""The HTTP/2 client of ``purgatory bench fanout --http2``: many long polls per h2c connection.

A real, standard client, driven without a task per request: the ``h2`` library's client state
machine in one :class:`asyncio.Protocol` per connection (prior knowledge: the connection preface,
then the requests), ``--streams-per-connection`` long polls on each. httpx (``http2=True``) would
do, but httpcore holds at most 100 streams at once per connection and reads a connection under
one lock that a stream still waiting for its answer holds (tests/service/test_h2.py says more),
and a task per request on the client's side of the 2 shared cores is what the service's figures
would then pay for.

The answers' bytes are acknowledged as they arrive (WINDOW_UPDATE), so the service's flow control
is exercised (one connection's answers are far larger than the 64 KiB initial window).
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import h2.config
import h2.connection
import h2.events

__all__ = ["H2LongPoll", "open_h2_long_polls"]

CONNECT_CONCURRENCY = 16  # connections being opened at once (each sends its streams in one write)


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
    """One h2c connection carrying ``len(polls)`` long polls; ``sent`` once all were written."""

    def __init__(self, authority: bytes, requests: list[tuple[bytes, H2LongPoll]]) -> None:
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.authority = authority
        self.requests = requests
        self.by_stream: dict[int, H2LongPoll] = {}
        self.bodies: dict[int, bytearray] = {}
        self.statuses: dict[int, int] = {}
        self.transport: asyncio.Transport | None = None
        self.sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        conn = self.conn
        conn.initiate_connection()
        for path, poll in self.requests:
            stream_id = conn.get_next_available_stream_id()
            headers = [
                (b":method", b"GET"),
                (b":scheme", b"http"),
                (b":authority", self.authority),
                (b":path", path),
            ]
            conn.send_headers(stream_id, headers, end_stream=True)
            poll.transport = self.transport
            self.by_stream[stream_id] = poll
        self.transport.write(conn.data_to_send())
        self.sent.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                self.statuses[event.stream_id] = int(dict(event.headers or ())[b":status"])
            elif isinstance(event, h2.events.DataReceived):
                self.bodies.setdefault(event.stream_id, bytearray()).extend(event.data or b"")
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                poll = self.by_stream[event.stream_id]
                poll.body = bytes(self.bodies.pop(event.stream_id, b""))
                poll.status = self.statuses.pop(event.stream_id, 0)  # set once the answer is whole
                poll.answered_ns = now
            elif isinstance(event, h2.events.StreamReset):
                poll = self.by_stream[event.stream_id]
                poll.status, poll.answered_ns = -2, now  # reset by the service
        assert self.transport is not None
        out = self.conn.data_to_send()
        if out:
            self.transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        now = time.monotonic_ns()
        for poll in self.by_stream.values():
            if not poll.answered_ns:
                poll.status, poll.answered_ns = -1, now  # closed without an answer


async def open_h2_long_polls(
    port: int, topic: str, waiters: int, partitions: int, max_wait_ms: int, streams_per_connection: int
) -> list[H2LongPoll]:
    """``waiters`` long polls (waiter ``i`` on partition ``i % partitions``) over h2c connections."""
    loop = asyncio.get_running_loop()
    polls = [H2LongPoll(i % partitions) for i in range(waiters)]
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def open_one(first: int) -> None:
        chunk = polls[first : first + streams_per_connection]
        requests = [
            (
                f"/topics/{topic}/partitions/{p.partition}/records?offset=0&max_wait_ms={max_wait_ms}".encode(),
                p,
            )
            for p in chunk
        ]
        async with gate:
            _, protocol = await loop.create_connection(
                lambda: _H2Connection(b"127.0.0.1", requests), "127.0.0.1", port
            )
            await protocol.sent

    await asyncio.gather(*(open_one(i) for i in range(0, waiters, streams_per_connection)))
    return polls
