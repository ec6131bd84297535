"""``purgatory bench fanout --client h2load``: nghttp2's h2load sends the long polls, and its log
gives each answer's status and time.

Loopback servers of the test's own (no Kafka, no service), as for the Node client: an HTTP/1.1
one that answers each connection when the test says, and an HTTP/2 one on the ``h2`` library.
What is pinned: every waiter's request reaches the server (HTTP/1.1: a connection each; HTTP/2:
``http2_streams`` per connection), each answer's status comes back, and its time — h2load logs
wall-clock microseconds — is moved to this process's ``time.monotonic_ns`` clock, which the
bench subtracts the produce's time from.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from purgatory.tools.bench.service.h2load_client import H2loadLongPolls

from .test_bench_client import _Server  # the loopback HTTP/1.1 server that answers when told
from .test_node_bench_client import COMPLETED, WAIT_S, _h1_answer, _H2Server, _wait_for, loopback_server

pytestmark = pytest.mark.skipif(
    not H2loadLongPolls.available(), reason="h2load (nghttp2-client) is not on PATH"
)

# h2load logs whole microseconds since the epoch; moved to the monotonic clock they may land a
# little before or after the instants the test took around them.
SLACK_NS = 2_000_000


async def test_h2load_sends_each_http11_long_poll_on_its_own_connection_and_times_each_answer() -> None:
    connections: list[_Server] = []
    async with loopback_server(_Server, connections=connections) as port:
        client = H2loadLongPolls(port, "orders", 3, 1, 30_000, offset=1, http2_streams=0, timeout_s=WAIT_S)
        try:
            client.wait_opened()
            await _wait_for(
                lambda: sum(c.request.endswith(b"\r\n\r\n") for c in connections) == 3, "3 requests arrive"
            )
            paths = {c.request.split(b" ")[1].decode() for c in connections}
            assert paths == {"/topics/orders/partitions/0/records?offset=1&max_wait_ms=30000"}
            before = time.monotonic_ns()
            for i, connection in enumerate(connections):
                answer = _h1_answer(504, b'{"error":"x"}') if i == 2 else _h1_answer(200, COMPLETED)
                connection.transport.write(answer)  # type: ignore[attr-defined]
            await asyncio.to_thread(client.join)
            after = time.monotonic_ns()
        finally:
            client.stop()
    assert sorted(p.status for p in client.polls) == [200, 200, 504]
    for poll in client.polls:
        assert before - SLACK_NS <= poll.answered_ns <= after + SLACK_NS, "not on time.monotonic_ns's clock"
        assert json.loads(poll.body).get("outcome") == ("COMPLETED" if poll.status == 200 else None)
    assert client.errors == {"failed": 1}, "h2load counts the 504 as failed"
    assert client.cpu_s > 0, "h2load's CPU is read when it exits"


async def test_h2load_sends_http2_long_polls_as_streams_of_shared_connections() -> None:
    sessions: list[_H2Server] = []
    async with loopback_server(_H2Server, sessions=sessions) as port:
        client = H2loadLongPolls(port, "orders", 4, 2, 30_000, offset=1, http2_streams=2, timeout_s=WAIT_S)
        try:
            await _wait_for(lambda: sum(len(s.paths) for s in sessions) == 4, "4 streams arrive")
            assert sorted(len(s.paths) for s in sessions) == [2, 2], "2 streams per connection"
            partitions = sorted(path.split("/")[4] for s in sessions for path in s.paths.values())
            assert partitions == ["0", "0", "1", "1"], "each connection takes the partitions in turn"
            before = time.monotonic_ns()
            for session in sessions:
                session.answer_all()
            await asyncio.to_thread(client.join)
            after = time.monotonic_ns()
        finally:
            client.stop()
    assert [p.status for p in client.polls] == [200] * 4
    assert all(before - SLACK_NS <= p.answered_ns <= after + SLACK_NS for p in client.polls)
    assert client.errors == {}


def test_http11_long_polls_on_several_partitions_are_refused() -> None:
    with pytest.raises(ValueError, match="one partition"):
        H2loadLongPolls(1, "orders", 4, 2, 30_000, offset=1, http2_streams=0, timeout_s=1.0)
