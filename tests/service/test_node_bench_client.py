"""``purgatory bench fanout --client node``: Node's own HTTP stacks send the long polls and time the answers.

Loopback servers of the test's own (no Kafka, no service): an HTTP/1.1 one that answers each
connection when the test says, and an HTTP/2 one built on the ``h2`` library. What is pinned:
every waiter's request reaches the server (waiter i on partition i % partitions), each answer's
status and outcome come back, and its time is on this process's ``time.monotonic_ns`` clock
(the bench subtracts the produce's time from it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h2.config
import h2.connection
import h2.events
import pytest
from purgatory.tools.bench.service.node_client import NodeLongPolls

from .test_bench_client import _Server  # the loopback HTTP/1.1 server that answers when told

pytestmark = pytest.mark.skipif(not NodeLongPolls.available(), reason="node is not on PATH")

WAIT_S = 20.0
COMPLETED = json.dumps({"outcome": "COMPLETED", "records": []}).encode()


def _h1_answer(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 504: "Gateway Timeout"}[status]
    return b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\n\r\n%s" % (status, reason.encode(), len(body), body)


@asynccontextmanager
async def loopback_server(protocol: type[asyncio.Protocol], **shared: object) -> AsyncIterator[int]:
    """A server on 127.0.0.1 making ``protocol`` connections, ``shared`` as their class attributes
    (the lists they register in); its port, the server closed on exit."""
    server = await asyncio.get_running_loop().create_server(
        type("Server", (protocol,), shared), "127.0.0.1", 0
    )
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_node_sends_each_long_poll_on_its_own_connection_and_times_each_answer() -> None:
    connections: list[_Server] = []
    async with loopback_server(_Server, connections=connections) as port:
        client = NodeLongPolls(port, "orders", 3, 2, 30_000, offset=1, http2_streams=0, timeout_s=WAIT_S)
        try:
            await asyncio.to_thread(client.wait_opened)
            await _wait_for(
                lambda: sum(c.request.endswith(b"\r\n\r\n") for c in connections) == 3, "3 requests arrive"
            )
            before = time.monotonic_ns()
            paths = sorted(c.request.split(b" ")[1].decode() for c in connections)
            first, second = (
                f"/topics/orders/partitions/{p}/records?offset=1&max_wait_ms=30000" for p in (0, 1)
            )
            assert paths == [first, first, second], "waiter i polls partition i % partitions"
            for i, connection in enumerate(connections):
                answer = _h1_answer(504, b'{"error":"x"}') if i == 2 else _h1_answer(200, COMPLETED)
                connection.transport.write(answer)  # type: ignore[attr-defined]
            await asyncio.to_thread(client.join)
            after = time.monotonic_ns()
        finally:
            client.stop()
    statuses = sorted(p.status for p in client.polls)
    assert statuses == [200, 200, 504]
    assert sorted(p.partition for p in client.polls) == [0, 0, 1]
    for poll in client.polls:
        assert before <= poll.answered_ns <= after, "Node's answer time is on time.monotonic_ns's clock"
        outcome = json.loads(poll.body)["outcome"]
        assert outcome == ("COMPLETED" if poll.status == 200 else None)
    assert before <= client.first.answered_ns <= min(p.answered_ns for p in client.polls) + 1
    assert client.cpu_s > 0, "Node's CPU comes with its answers"


class _H2Server(asyncio.Protocol):
    sessions: list[_H2Server]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.conn.initiate_connection()
        self.transport.write(self.conn.data_to_send())
        self.paths: dict[int, str] = {}
        self.sessions.append(self)

    def data_received(self, data: bytes) -> None:
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                headers = {k.decode() if isinstance(k, bytes) else k: v for k, v in event.headers or []}
                path = headers[":path"]
                self.paths[event.stream_id] = path.decode() if isinstance(path, bytes) else path
        self.transport.write(self.conn.data_to_send())

    def answer_all(self) -> None:
        for stream_id in self.paths:
            self.conn.send_headers(stream_id, [(":status", "200"), ("content-length", str(len(COMPLETED)))])
            self.conn.send_data(stream_id, COMPLETED, end_stream=True)
        self.transport.write(self.conn.data_to_send())


async def test_node_sends_http2_long_polls_as_streams_of_shared_sessions() -> None:
    sessions: list[_H2Server] = []
    async with loopback_server(_H2Server, sessions=sessions) as port:
        client = NodeLongPolls(port, "orders", 5, 1, 30_000, offset=1, http2_streams=2, timeout_s=WAIT_S)
        try:
            await asyncio.to_thread(client.wait_opened)
            await _wait_for(lambda: sum(len(s.paths) for s in sessions) == 5, "5 streams arrive")
            assert sorted(len(s.paths) for s in sessions) == [1, 2, 2], "2 streams per session"
            before = time.monotonic_ns()
            for session in sessions:
                session.answer_all()
            await asyncio.to_thread(client.join)
            after = time.monotonic_ns()
        finally:
            client.stop()
    assert [p.status for p in client.polls] == [200] * 5
    assert all(before <= p.answered_ns <= after for p in client.polls)
    assert {json.loads(p.body)["outcome"] for p in client.polls} == {"COMPLETED"}
