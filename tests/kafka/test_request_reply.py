"""Request-reply over Kafka on a real cluster: requests are delayed operations on their correlation id.

Each test uses fresh request and reply topics and its own responder groups, so tests do not see
each other's records. Responders run in threads here; the crash test runs one in a process of
its own and kills it by PID.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from purgatory.adapters.kafka import (
    CORRELATION_ID,
    REPLY_FROM,
    REPLY_PARTITION,
    REPLY_TOPIC,
    KafkaPurgatory,
    Request,
    RequestTimeoutError,
    Responder,
    ResponderError,
    request_of,
    responder,
)
from purgatory.adapters.kafka.reply._responder import COMMIT_MAX_DELAY_S
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory.journal import EventType, Journal, MemoryJournalSink

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import TopicFactory

REPLY_PARTITIONS = 2


def _connect(settings: KafkaSettings, reply_topic: str, group: str | None = None) -> KafkaPurgatory:
    kp = KafkaPurgatory.connect(settings, name="rr")
    kp.replies(reply_topic, group=group, partitions=REPLY_PARTITIONS)
    return kp


@pytest.fixture
def requester(kafka_settings: KafkaSettings) -> Iterator[KafkaPurgatory]:
    kp = _connect(kafka_settings, f"replies-{uuid.uuid4().hex[:8]}")
    try:
        yield kp
    finally:
        kp.close()


def _group() -> str:
    return f"responder-{uuid.uuid4().hex[:8]}"


def _started(r: Responder, settings: KafkaSettings) -> Responder:
    r.start(settings)
    assert r.assigned.wait(WAIT_S), f"responder group {r.group} was never assigned {r.topic}"
    return r


def _echo(topic: str, prefix: bytes = b"") -> Responder:
    @responder(topic, group=_group())
    def echo(request: Request) -> bytes:
        return prefix + (request.value or b"")

    return echo


def test_request_gets_the_reply_before_its_deadline(
    requester: KafkaPurgatory, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="prices")

    @responder(topic, group=_group())
    def price(request: Request) -> bytes:
        return b"price of " + (request.value or b"")

    with _started(price, kafka_settings):

        async def ask() -> bytes | None:
            result = await requester.aio.request(topic, b"AAPL", timeout_ms=10_000)
            assert result.complete and len(result.replies) == 1
            assert result.reply.responder == price.group, "the reply names the group that answered"
            return result.value

        assert asyncio.run(ask()) == b"price of AAPL"
        op = requester.request(topic, b"MSFT", timeout_ms=10_000)  # the threads' form
        assert op.wait(WAIT_S) and op.result().value == b"price of MSFT"
    stats = requester.replies().stats
    assert (stats.answered, stats.expired, stats.late, stats.duplicates) == (2, 0, 0, 0)
    assert requester.replies().pending() == 0, "an answered request is no longer pending"


def test_late_reply_after_expiry_is_ignored_counted_and_journaled(
    requester: KafkaPurgatory, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="slow")
    sink = MemoryJournalSink()
    journal = Journal([sink])
    journal.attach(requester.replies().purgatory)
    release = threading.Event()

    @responder(topic, group=_group())
    def slow(request: Request) -> bytes:
        assert release.wait(WAIT_S), "the test releases the handler after the request expired"
        return b"too late"

    with _started(slow, kafka_settings):
        op = requester.request(topic, b"q", timeout_ms=2_000)
        assert op.wait(WAIT_S)
        with pytest.raises(RequestTimeoutError) as timed_out:
            op.result()
        assert timed_out.value.replies == () and timed_out.value.wanted == 1
        assert timed_out.value.correlation_id == op.correlation_id
        release.set()
        stats = requester.replies().stats
        wait_until(lambda: stats.late == 1, "the reply after the deadline is counted as late")
        assert (slow.stats.requests, slow.stats.expired) == (1, 0), "handled in time, answered late"
    assert op.result is not None and stats.answered == 0 and stats.expired == 1
    journal.close()
    mine = [e for e in sink.events if e.event_type is not EventType.CREATED or op.key.label in e.keys]
    kinds = sorted((e.op_type, e.event_type.value) for e in mine)
    assert kinds == [
        ("DelayedRequest", "created"),
        ("DelayedRequest", "expired"),
        ("LateReply", "completed"),
        ("LateReply", "created"),
    ], f"the request's lifecycle and its late reply are journaled: {kinds}"


def _requests(bootstrap: str, topic: str, count: int) -> list[Request]:
    """Read ``count`` requests of ``topic`` as a hand-written responder would (assign, no group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        out: list[Request] = []
        for message in consumer.consume(count, timeout=WAIT_S):
            assert message.error() is None, message.error()
            out.append(request_of(message))
        assert len(out) == count, f"read {len(out)} of {count} requests"
        return out
    finally:
        consumer.close()


def _reply(producer: Producer, request: Request, value: bytes, responder_id: str) -> None:
    assert request.reply_to is not None and request.correlation_id is not None
    assert request.reply_to.partition is not None, "the requester names its own reply partition"
    producer.produce(
        request.reply_to.topic,
        value,
        partition=request.reply_to.partition,
        headers=[(CORRELATION_ID, request.correlation_id.encode()), (REPLY_FROM, responder_id.encode())],
    )
    producer.flush(WAIT_S)


def test_a_request_carries_its_records_timestamp(
    requester: KafkaPurgatory, kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    """``Request.timestamp_ms``: when the request record was made (or appended, LogAppendTime);
    the request-reply trace bench reads it instead of patching ``request_of``."""
    topic = kafka_topic_factory(prefix="stamp")
    before_ms = int(time.time() * 1000)
    op = requester.request(topic, b"q", timeout_ms=1_000)
    (request,) = _requests(kafka_bootstrap, topic, 1)
    assert request.timestamp_ms is not None, "a produced record has a timestamp"
    assert before_ms - 1_000 <= request.timestamp_ms <= int(time.time() * 1000) + 1_000, request.timestamp_ms
    assert op.wait(WAIT_S), "the unanswered request expires"


def test_duplicate_replies_count_once_and_complete_the_request_once(
    requester: KafkaPurgatory, kafka_bootstrap: str, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="dup")
    op = requester.request(topic, b"q", timeout_ms=20_000, replies=2)
    (request,) = _requests(kafka_bootstrap, topic, 1)
    assert {REPLY_TOPIC, REPLY_PARTITION} <= {name for name, _ in request.headers}
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(3):  # an at-least-once responder answering a redelivered request, thrice
        _reply(producer, request, b"a", "group-a")
    stats = requester.replies().stats
    wait_until(lambda: stats.duplicates == 2, "two copies of group-a's reply are seen and dropped")
    assert not op.is_completed(), "copies of one responder's reply do not make 2-of-2"
    _reply(producer, request, b"b", "group-b")
    assert op.wait(WAIT_S)
    result = op.result()
    assert [r.value for r in result.replies] == [b"a", b"b"] and result.complete
    _reply(producer, request, b"b", "group-b")  # after the answer: a duplicate, not a second finish
    wait_until(lambda: stats.duplicates == 3, "a copy after the answer is a duplicate")
    assert (stats.answered, stats.late) == (1, 0)


def test_scatter_gather_returns_n_of_m_and_partial_results_at_the_deadline(
    requester: KafkaPurgatory, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="quotes")
    responders = [_echo(topic, name) for name in (b"x:", b"y:", b"z:")]
    for r in responders:
        _started(r, kafka_settings)
    try:

        async def gather() -> None:
            all_three = await requester.aio.request(topic, b"q", timeout_ms=10_000, replies=3)
            assert sorted(r.value or b"" for r in all_three.replies) == [b"x:q", b"y:q", b"z:q"]
            assert {r.responder for r in all_three.replies} == {r.group for r in responders}
            partial = await requester.aio.request(topic, b"p", timeout_ms=1_500, replies=4, partial=True)
            assert not partial.complete and len(partial.replies) == 3, "3 of 4 answered by the deadline"
            with pytest.raises(RequestTimeoutError) as timed_out:
                await requester.aio.request(topic, b"r", timeout_ms=1_500, replies=4)
            assert len(timed_out.value.replies) == 3, "the timeout error carries what arrived"

        asyncio.run(gather())
    finally:
        for r in responders:
            r.stop()


def test_a_responder_under_sustained_load_commits_acknowledged_replies_without_flushing(
    requester: KafkaPurgatory, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    # linger 20 ms with a request every ~2 ms: some reply is always in flight, so there is never a
    # moment with none to commit at. The responder must commit behind the acknowledged replies
    # (checkpoints) instead of stopping every COMMIT_MAX_DELAY_S to flush (a stall of every
    # request behind a broker round trip: the 3-broker p99 of the request-reply bench).
    topic = kafka_topic_factory(prefix="sustained")
    echo = Responder(topic, lambda request: request.value, group=_group(), linger_ms=20)
    seconds, every_s = COMMIT_MAX_DELAY_S + 1.5, 0.002
    probe = Consumer({"bootstrap.servers": kafka_settings.bootstrap_servers, "group.id": echo.group})
    try:
        with _started(echo, kafka_settings):

            async def load() -> tuple[int, int]:
                loop = asyncio.get_running_loop()
                tasks = []
                end = loop.time() + seconds
                while loop.time() < end:
                    tasks.append(asyncio.create_task(requester.aio.request(topic, b"v", timeout_ms=30_000)))
                    await asyncio.sleep(every_s)
                # Still under load (the last replies are lingering): what was committed so far.
                committed = probe.committed([TopicPartition(topic, 0)], timeout=WAIT_S)[0].offset
                flushes = echo.stats.flushes
                assert all(r.value == b"v" for r in await asyncio.gather(*tasks))
                return committed, flushes

            committed, flushes = asyncio.run(load())
            assert flushes == 0, "commits followed the acknowledged replies; the loop never stopped to flush"
            assert committed > 0, "offsets were committed while replies were always in flight"
            assert echo.stats.commits >= 2
    finally:
        probe.close()
    assert echo.stats.answered == echo.stats.requests


def test_a_raising_handler_answers_with_a_responder_error(
    requester: KafkaPurgatory, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="broken")

    @responder(topic, group=_group())
    def broken(request: Request) -> bytes:
        raise ValueError(f"cannot price {request.value!r}")

    with _started(broken, kafka_settings):
        op = requester.request(topic, b"??", timeout_ms=10_000)
        assert op.wait(WAIT_S)
        with pytest.raises(ResponderError, match="ValueError: cannot price"):
            op.result()
    assert broken.stats.errors == 1


_HANGING_RESPONDER = """
import sys, threading
from purgatory.adapters.kafka import responder
from purgatory.adapters.kafka.settings import KafkaSettings

topic, group, bootstrap = sys.argv[1:4]

@responder(topic, group=group, session_timeout_ms=6000)
def hang(request):
    print("handling", request.correlation_id, flush=True)
    threading.Event().wait()  # the test kills this process here, mid-request

hang.run(KafkaSettings(bootstrap_servers=bootstrap))
"""


def test_a_responder_crashing_mid_request_is_answered_by_the_redelivery(
    requester: KafkaPurgatory, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="crash")
    group = _group()
    process = subprocess.Popen(
        [sys.executable, "-c", _HANGING_RESPONDER, topic, group, kafka_settings.bootstrap_servers or ""],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        op = requester.request(topic, b"q", timeout_ms=60_000)
        stdout = process.stdout
        assert stdout is not None
        handling: list[str] = []
        took_it = threading.Event()

        def read() -> None:  # its stdout also carries log lines: find the handler's
            for line in stdout:
                if line.startswith("handling "):
                    handling.append(line.split()[1])
                    took_it.set()
                    return

        threading.Thread(target=read, daemon=True).start()
        assert took_it.wait(WAIT_S * 2), "the responder process took the request (group join, first fetch)"
        assert handling == [op.correlation_id]
    finally:
        os.kill(process.pid, signal.SIGKILL)  # a crash: no reply, no commit, no LeaveGroup
        process.wait(WAIT_S)
    survivor = _echo(topic, b"again:")
    survivor.group = group  # same group: it inherits the uncommitted request
    with survivor.start(kafka_settings):
        assert op.wait(40), "the group redelivers the request after the dead member's session (6 s)"
        assert op.result().value == b"again:q"
    assert survivor.stats.answered == 1


def test_two_requester_instances_get_their_own_replies_across_a_rebalance(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="shared")
    reply_topic, reply_group = f"replies-{uuid.uuid4().hex[:8]}", f"requesters-{uuid.uuid4().hex[:8]}"
    release = threading.Event()

    @responder(topic, group=_group())
    def gated(request: Request) -> bytes:
        assert release.wait(WAIT_S), "released once both requesters own a reply partition"
        return b"re:" + (request.value or b"")

    a = _connect(kafka_settings, reply_topic, reply_group)
    b: KafkaPurgatory | None = None
    try:
        with _started(gated, kafka_settings):
            a.replies().start()
            wait_until(lambda: len(a.replies().ready()) == 2, "a alone owns and reads both reply partitions")
            first = [a.request(topic, f"a{i}".encode(), timeout_ms=60_000) for i in range(2)]
            assert {op.reply_partition for op in first} == {0}, "alone, a names its home partition"
            b = _connect(kafka_settings, reply_topic, reply_group)
            b.replies().start()
            routers = (a.replies(), b.replies())
            wait_until(
                lambda: (
                    all(len(r.ready()) == 1 for r in routers) and routers[0].ready() != routers[1].ready()
                ),
                "the reply group split the two partitions between a and b",
                timeout_s=40,
            )
            from_b = b.request(topic, b"b0", timeout_ms=60_000)
            assert from_b.reply_partition == routers[1].ready()[0]
            # The sticky assignor has so far handed b the first of a's partitions, a's home, so
            # both of a's waiting requests named a partition that is b's now; which one b gets is
            # the assignor's choice, so the counts below hold either way (the moved case alone is
            # pinned by test_a_revoked_reply_partition_is_read_until_its_requests_finish).
            moved = [op for op in first if op.reply_partition in routers[1].ready()]
            release.set()
            for op in (*first, from_b):
                assert op.wait(WAIT_S), f"request {op.correlation_id} answered"
            assert sorted(op.result().value or b"" for op in first) == [b"re:a0", b"re:a1"]
            assert from_b.result().value == b"re:b0"
        # a's requests that named the partition now owned by b were answered at a (its tail kept
        # reading it): b saw those replies as someone else's.
        assert routers[0].stats.answered == 2 and routers[1].stats.answered == 1
        assert routers[1].stats.unknown == len(moved), (
            "b dropped the replies of a's requests on its partition"
        )
    finally:
        a.close()
        if b is not None:
            b.close()
