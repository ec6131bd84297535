"""``purgatory bench fanout``'s HTTP/1.1 client: every answer read whole, timed when its last byte came.

A loopback server of the test's own (no Kafka, no service): it answers each long poll the way
the test says — at once, in pieces, or not at all (closing).
"""

from __future__ import annotations

import asyncio
import time

from purgatory.tools.bench.service.h1_client import AnswerReader, H1LongPoll, open_long_polls

WAIT_S = 20.0  # bound on the reader in these tests

BODY = b'{"outcome":"COMPLETED"}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)


class _Server(asyncio.Protocol):
    """Keeps each connection until the test answers it; counts the requests it received whole."""

    connections: list[_Server]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.request = b""
        self.connections.append(self)

    def data_received(self, data: bytes) -> None:
        self.request += data


async def _serve(count: int) -> tuple[asyncio.Server, list[_Server], list[H1LongPoll]]:
    connections: list[_Server] = []
    server_class = type("Server", (_Server,), {"connections": connections})
    server = await asyncio.get_running_loop().create_server(server_class, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    polls = await open_long_polls(port, "orders", count, 2, 30_000)
    deadline = time.monotonic() + WAIT_S
    while sum(c.request.endswith(b"\r\n\r\n") for c in connections) < count:
        assert time.monotonic() < deadline, "every long poll reached the server"
        await asyncio.sleep(0.01)
    return server, connections, polls


async def test_each_answer_is_read_whole_and_timed_at_its_last_byte() -> None:
    server, connections, polls = await _serve(3)
    whole, split, closed = connections
    ports = {c.transport.get_extra_info("peername")[1]: c for c in connections}  # type: ignore[attr-defined]
    answers = {ports[p.sock.getsockname()[1]]: p for p in polls}  # the server's connection -> its poll
    reader = AnswerReader(polls, time.monotonic() + WAIT_S)
    reader.start()
    try:
        whole.transport.write(HEAD + BODY)  # type: ignore[attr-defined]
        split.transport.write(HEAD[:20])  # type: ignore[attr-defined]  # a head in pieces ...
        await asyncio.sleep(0.05)  # (not synchronisation: spaces the pieces, whatever the timing)
        split.transport.write(HEAD[20:] + BODY[:5])  # type: ignore[attr-defined]  # ... and a body
        await asyncio.sleep(0.05)
        before_last_piece = time.monotonic_ns()
        split.transport.write(BODY[5:])  # type: ignore[attr-defined]
        closed.transport.close()  # no answer at all
        await asyncio.to_thread(reader.join)
    finally:
        reader.stop()
        await asyncio.to_thread(reader.join)
        for poll in polls:
            poll.close()
        server.close()
    requests = {c.request.split(b" ")[1] for c in connections}
    assert requests == {
        b"/topics/orders/partitions/0/records?offset=0&max_wait_ms=30000",
        b"/topics/orders/partitions/1/records?offset=0&max_wait_ms=30000",
    }, "waiter i polls partition i % partitions"
    assert (answers[whole].status, answers[whole].body) == (200, BODY)
    assert (answers[split].status, answers[split].body) == (200, BODY), "pieces joined into one answer"
    assert answers[split].answered_ns >= before_last_piece, "timed when its last byte arrived, not its first"
    assert answers[closed].status == -1 and answers[closed].answered_ns, "closed unanswered: counted as such"
    assert reader.unanswered == 0


async def test_the_reader_stops_at_its_deadline_leaving_the_unanswered_unanswered() -> None:
    server, _, polls = await _serve(2)
    reader = AnswerReader(polls, time.monotonic() + 0.3)
    reader.start()
    try:
        await asyncio.to_thread(reader.join)  # bounded by the deadline: nobody answers
    finally:
        for poll in polls:
            poll.close()
        server.close()
    assert reader.unanswered == 2
    assert all(p.answered_ns == 0 and p.status == 0 for p in polls), "no answer invented"
