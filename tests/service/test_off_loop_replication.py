"""OffLoopReplication: a replication wait never reads records back on the event loop's thread (no Kafka)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from purgatory.adapters.kafka import (
    Appended,
    ErrorCode,
    FetchedRecord,
    PartitionFacts,
    RecordIdentity,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.ops._off_loop import OffLoopReplication

from tests.kafka.test_fence_and_calls import FakeFacts

KEY = TopicPartitionKey("orders", 0)
RECORD = FetchedRecord(10, b"k", b"v", 1_000)


class ThreadNotingLog:
    """Holds RECORD; notes the thread of every read."""

    def __init__(self) -> None:
        self.read_on: list[int] = []

    def read(self, key: TopicPartitionKey, start: int, end: int, *, max_bytes: int) -> list[FetchedRecord]:
        self.read_on.append(threading.get_ident())
        return [RECORD] if start <= RECORD.offset < end else []


def test_an_attempt_on_the_loop_thread_that_needs_a_read_back_hands_it_to_the_executor_once() -> None:
    facts, log = FakeFacts(), ThreadNotingLog()
    facts.partitions[KEY] = PartitionFacts(
        high_watermark=11, leader=1, leader_epoch=4, isr=(1, 2, 3), min_insync_replicas=2
    )
    identity = RecordIdentity.of(RECORD.offset, RECORD.key, RECORD.value, RECORD.timestamp_ms)
    with ThreadPoolExecutor(1) as attempts:
        op = OffLoopReplication(
            facts,
            Appended({KEY: 10}, {KEY: 4}, {KEY: (identity,)}, log),
            delay_ms=60_000,
            loop_thread=threading.get_ident(),  # this test's thread plays the event loop's
            attempts=attempts,
        )
        assert not op.try_complete(), "declined on the loop: the read-back would block it"
        assert not op.try_complete()
        assert op.wait(10.0), "the executor's attempt read the record back and completed it"
    assert op.statuses == {KEY: ErrorCode.NONE}
    assert len(log.read_on) == 1 and threading.get_ident() not in log.read_on, "one read, off the loop"


class RefusingAttempts:
    """An executor that refuses every hand-off (shut down, or its backlog full)."""

    def submit(self, fn: object, /) -> object:
        raise RuntimeError("cannot schedule new futures after shutdown")


def test_a_refused_hand_off_leaves_the_wait_for_an_attempt_off_the_loop() -> None:
    facts, log = FakeFacts(), ThreadNotingLog()
    facts.partitions[KEY] = PartitionFacts(
        high_watermark=11, leader=1, leader_epoch=4, isr=(1, 2, 3), min_insync_replicas=2
    )
    identity = RecordIdentity.of(RECORD.offset, RECORD.key, RECORD.value, RECORD.timestamp_ms)
    op = OffLoopReplication(
        facts,
        Appended({KEY: 10}, {KEY: 4}, {KEY: (identity,)}, log),
        delay_ms=60_000,
        loop_thread=threading.get_ident(),
        attempts=RefusingAttempts(),
    )
    assert not op.try_complete(), "declined on the loop, and the refusal did not raise"
    assert log.read_on == []
    feed = threading.Thread(target=op.try_complete)  # the feed's next check, on its thread
    feed.start()
    feed.join()
    assert op.statuses == {KEY: ErrorCode.NONE} and len(log.read_on) == 1
