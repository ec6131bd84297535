"""The HTTP/1.1 answer burst: waiting long polls released by one produce are written together
(one run, the writes shared among threads) and each connection then goes on as any answered one:
its next request served, a head it trickles timed out with a 408, an idle one closed — by the
timeouts the run's connections share.

Real Kafka, the service on its own server (its fast paths), raw connections.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service.http._fanout_writes import MIN_SHARED_WRITES

from .conftest import WAIT_S, Served, until
from .test_long_poll import RawConnection, _get, _produce, _served, _warm

pytestmark = pytest.mark.kafka

HEAD_TIMEOUT_MS = 1500  # below uvicorn's 5 s keep-alive: the head bound is what an idle one meets
POLLS = MIN_SHARED_WRITES + 8  # enough for the run's writes to be shared among threads


@asynccontextmanager
async def _released_polls(
    served: Served,
    topic: str,
    value: str,
    read: Callable[[RawConnection], Awaitable[bytes]] = RawConnection.response,
) -> AsyncIterator[tuple[list[RawConnection], list[bytes]]]:
    """POLLS long polls waiting on ``topic`` from its start, then released by one produce of
    ``value``: their connections (closed on exit) and what ``read`` read of each (by default its
    answer), every connection read from before the produce, as clients wait."""
    conns = [await RawConnection.open(served.port) for _ in range(POLLS)]
    try:
        for conn in conns:
            conn.send(_get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=30000"))
        await until(lambda: served.pending >= POLLS, f"{POLLS} long polls waiting")
        reading = asyncio.gather(*(read(conn) for conn in conns))
        try:
            await asyncio.to_thread(_produce, served.port, topic, value)
            answers = await reading
        finally:
            reading.cancel()  # nothing left reading once the connections close (a no-op if done)
        yield conns, answers
    finally:
        for conn in conns:
            await conn.close()


@pytest.fixture(scope="module")
def burst_served(kafka_settings: KafkaSettings) -> Iterator[Served]:
    with _served(kafka_settings, head_read_timeout_ms=HEAD_TIMEOUT_MS) as served:
        yield served


def test_a_burst_answers_every_waiting_poll_with_the_same_bytes(
    burst_served: Served, kafka_topic_factory: object
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    _warm(burst_served.port, topic)

    async def burst() -> list[bytes]:
        async with _released_polls(burst_served, topic, "burst") as (_, answers):
            return answers

    before = burst_served.taken
    answers = asyncio.run(burst())
    assert burst_served.taken - before == POLLS, "every poll on the fast path"
    assert b'"value":"burst"' in answers[0] and b'"outcome":"COMPLETED"' in answers[0]
    assert all(answer == answers[0] for answer in answers), "one answer, the same bytes everywhere"


def test_after_a_burst_each_connection_is_served_timed_or_closed_as_its_client_acts(
    burst_served: Served, kafka_topic_factory: object
) -> None:
    """One run's connections share their keep-alive and head timeouts: a client's next request
    must drop its share (served, not closed under it), a trickled head must still get its 408,
    and an idle connection must close at the head timeout — not before."""
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    _warm(burst_served.port, topic)
    timeout_s = HEAD_TIMEOUT_MS / 1000

    async def after_burst() -> tuple[bytes, bytes, bytes, float]:
        async with _released_polls(burst_served, topic, "x") as (conns, _):
            answered = time.monotonic()
            served, trickled, idle = conns[0], conns[1], conns[2]
            served.send(_get("/healthz"))
            health = await served.response()
            trickled.send(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n")  # no blank line: never whole
            async with asyncio.timeout(timeout_s + WAIT_S):
                refused = await trickled.reader.read()  # the 408, then EOF
                idle_tail = await idle.reader.read()  # EOF: closed at the head timeout
            return health, refused, idle_tail, time.monotonic() - answered

    health, refused, idle_tail, idle_s = asyncio.run(after_burst())
    assert health.startswith(b"HTTP/1.1 200"), health[:200]
    assert refused.startswith(b"HTTP/1.1 408"), refused[:200]
    assert b"REQUEST_TIMEOUT" in refused
    assert idle_tail == b"", "the idle connection is closed with nothing sent"
    assert idle_s >= timeout_s - 0.1, f"closed after {idle_s:.2f} s, before the head timeout"


def test_clients_ending_their_connections_after_the_burst_are_all_closed_by_the_service(
    burst_served: Served, kafka_topic_factory: object
) -> None:
    """Each client half-closes as soon as it has its answer (as h2load and ``curl`` end theirs):
    those arriving while the burst runs are closed after it (AnswerBurst.defer_close), the others
    at once — every one must end, none left open."""
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    _warm(burst_served.port, topic)

    async def half_close_after_the_answer(conn: RawConnection) -> bytes:
        answer = await conn.response()
        conn.writer.write_eof()
        async with asyncio.timeout(WAIT_S):
            tail = await conn.reader.read()  # EOF once the service has closed its side
        return answer + tail

    async def burst() -> list[bytes]:
        async with _released_polls(burst_served, topic, "bye", half_close_after_the_answer) as (_, ended):
            return ended

    answers = asyncio.run(burst())
    assert len(answers) == POLLS
    assert all(b'"value":"bye"' in answer for answer in answers), "every answer whole, then EOF"
