"""DelayedReplication's leader-epoch fence and KafkaCalls' deadlines, with a fake FactSource (no Kafka)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest
from purgatory.adapters.kafka import (
    Appended,
    DelayedReplication,
    ErrorCode,
    FetchedRecord,
    KafkaCalls,
    KafkaUnavailableError,
    PartitionFacts,
    RecordIdentity,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.settings import KafkaSettings

KEY = TopicPartitionKey("orders", 0)


@dataclass
class FakeFacts:
    """A FactSource whose partition facts the test sets."""

    settings: KafkaSettings = field(default_factory=KafkaSettings)
    partitions: dict[TopicPartitionKey, PartitionFacts] = field(default_factory=dict)
    unavailable: str | None = None

    def partition(self, key: TopicPartitionKey) -> PartitionFacts | None:
        return self.partitions.get(key)

    def topic(self, key: object) -> None:
        return None

    def group(self, key: object) -> None:
        return None


def _facts(high: int, epoch: int | None, isr: tuple[int, ...] = (1, 2, 3)) -> PartitionFacts:
    return PartitionFacts(high_watermark=high, leader=1, leader_epoch=epoch, isr=isr, min_insync_replicas=2)


def test_replication_completes_none_when_the_watermark_of_the_same_epoch_passes_the_record() -> None:
    facts = FakeFacts()
    op = DelayedReplication(facts, Appended({KEY: 10}, {KEY: 4}), delay_ms=60_000)
    facts.partitions[KEY] = _facts(10, 4)
    assert not op.try_complete(), "high watermark 10 does not pass offset 10"
    facts.partitions[KEY] = _facts(11, 4)
    assert op.try_complete()
    assert op.statuses == {KEY: ErrorCode.NONE}


def test_replication_is_not_leader_when_another_epoch_passes_the_offset() -> None:
    facts = FakeFacts()
    op = DelayedReplication(facts, Appended({KEY: 10}, {KEY: 4}), delay_ms=60_000)
    facts.partitions[KEY] = _facts(50, 5)  # a new leader whose log may lack the record
    assert op.try_complete()
    assert op.statuses == {KEY: ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert not op.succeeded


def test_replication_waits_while_the_facts_carry_no_epoch() -> None:
    facts = FakeFacts()
    op = DelayedReplication(facts, Appended({KEY: 10}, {KEY: 4}), delay_ms=60_000)
    facts.partitions[KEY] = _facts(50, None)
    assert not op.try_complete(), "a watermark without its epoch cannot vouch for the record"


def test_a_partition_appended_without_a_known_epoch_answers_not_leader_at_once() -> None:
    other = TopicPartitionKey("orders", 1)
    facts = FakeFacts()
    op = DelayedReplication(facts, Appended({KEY: 3, other: 7}, {KEY: 4}), delay_ms=60_000)
    facts.partitions[KEY] = _facts(4, 4)
    assert op.try_complete()
    assert op.statuses == {KEY: ErrorCode.NONE, other: ErrorCode.NOT_LEADER_OR_FOLLOWER}


def test_a_target_offset_fences_from_the_first_epoch_seen() -> None:
    facts = FakeFacts()
    op = DelayedReplication(facts, {KEY: 10}, delay_ms=60_000)
    facts.partitions[KEY] = _facts(5, 7)
    assert not op.try_complete()
    assert op.leader_epochs == {KEY: 7}
    facts.partitions[KEY] = _facts(20, 8)
    assert op.try_complete()
    assert op.statuses == {KEY: ErrorCode.NOT_LEADER_OR_FOLLOWER}


def test_a_plain_mapping_of_records_keeps_old_callers_working_with_the_epoch_at_construction() -> None:
    facts = FakeFacts(partitions={KEY: _facts(5, 3)})
    op = DelayedReplication(facts, {KEY: 5}, delay_ms=60_000)
    assert op.leader_epochs == {KEY: 3}
    facts.partitions[KEY] = _facts(6, 3)
    assert op.try_complete() and op.succeeded


@dataclass
class FakeLog:
    """A record reader over records the test sets; counts its reads."""

    records: dict[int, FetchedRecord] = field(default_factory=dict)
    reads: int = 0

    def read(self, key: TopicPartitionKey, start: int, end: int, *, max_bytes: int) -> list[FetchedRecord]:
        self.reads += 1
        return [r for o, r in sorted(self.records.items()) if start <= o < end][:1]


APPENDED = FetchedRecord(10, b"k", b"mine", 1_000)


FIRST = FetchedRecord(8, None, b"first", 999)


def _identity(record: FetchedRecord) -> RecordIdentity:
    return RecordIdentity.of(record.offset, record.key, record.value, record.timestamp_ms)


def _appended(log: FakeLog) -> Appended:
    return Appended({KEY: 10}, {KEY: 4}, {KEY: (_identity(APPENDED),)}, log)


def test_replication_is_none_only_once_the_record_read_back_at_its_offset_is_the_one_appended() -> None:
    facts, log = FakeFacts(), FakeLog()
    op = DelayedReplication(facts, _appended(log), delay_ms=60_000)
    facts.partitions[KEY] = _facts(10, 4)
    assert not op.try_complete() and log.reads == 0, "nothing read while the watermark is short of it"
    facts.partitions[KEY] = _facts(11, 4)
    assert not op.try_complete(), "a read that brings nothing (a stalled broker) vouches for nothing"
    log.records[10] = APPENDED
    assert op.try_complete()
    assert op.statuses == {KEY: ErrorCode.NONE}


@pytest.mark.parametrize(
    "found",
    [
        FetchedRecord(10, b"k", b"theirs", 1_000),  # another record: a deposed leader's append was lost
        FetchedRecord(10, b"k", b"mine", 1_001),  # the same payload appended again later (a retry)
        FetchedRecord(10, None, b"mine", 1_000),  # no key is not an empty key
    ],
)
def test_replication_is_not_leader_when_another_record_is_at_its_offset_under_the_same_epoch(
    found: FetchedRecord,
) -> None:
    facts, log = FakeFacts(), FakeLog({found.offset: found})
    op = DelayedReplication(facts, _appended(log), delay_ms=60_000)
    facts.partitions[KEY] = _facts(20, 4)  # the epoch noted before the append: it cannot tell
    assert op.try_complete()
    assert op.statuses == {KEY: ErrorCode.NOT_LEADER_OR_FOLLOWER}


def test_replication_is_not_leader_when_its_first_record_is_gone_though_its_last_is_there() -> None:
    """One request's batches to a partition straddling the producer learning of a new leader:
    the first went to the deposed leader (lost), the last to the new one."""
    facts, log = FakeFacts(), FakeLog({8: FetchedRecord(8, None, b"theirs", 999), 10: APPENDED})
    appended = Appended({KEY: 10}, {KEY: 4}, {KEY: (_identity(FIRST), _identity(APPENDED))}, log)
    op = DelayedReplication(facts, appended, delay_ms=60_000)
    facts.partitions[KEY] = _facts(20, 4)
    assert op.try_complete()
    assert op.statuses == {KEY: ErrorCode.NOT_LEADER_OR_FOLLOWER}
    log.records[8] = FIRST
    again = DelayedReplication(facts, appended, delay_ms=60_000)
    assert again.try_complete() and again.statuses == {KEY: ErrorCode.NONE}
    assert log.reads == 1 + 2, "the first record found wrong ends the read-back; then both are read"


def test_kafka_calls_answer_a_stuck_call_at_its_deadline_and_keep_its_slot_until_it_returns() -> None:
    calls = KafkaCalls("test", workers=1, max_pending=2)
    release = threading.Event()

    async def scenario() -> None:
        with pytest.raises(KafkaUnavailableError, match=r"did not answer the stuck call within 0\.1 s"):
            await calls.run(release.wait, 10.0, timeout_s=0.1, what="the stuck call")
        assert calls.pending == 1, "the thread still runs the call: its slot is still taken"
        # A second call queues behind the stuck one and times out too, without ever running.
        ran = threading.Event()
        with pytest.raises(KafkaUnavailableError):
            await calls.run(ran.set, timeout_s=0.1, what="the queued call")
        assert not ran.is_set(), "a queued call whose caller gave up is cancelled"
        release.set()
        assert await calls.run(lambda: 42, timeout_s=5.0, what="the next call") == 42

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        calls.close()


def test_kafka_calls_refuse_at_once_past_their_backlog() -> None:
    calls = KafkaCalls("test", workers=1, max_pending=1)
    release = threading.Event()

    async def scenario() -> None:
        stuck = asyncio.ensure_future(calls.run(release.wait, 10.0, timeout_s=5.0, what="the stuck call"))
        await asyncio.sleep(0)  # let it be admitted
        with pytest.raises(KafkaUnavailableError, match="1 Kafka calls already pending"):
            await calls.run(lambda: None, timeout_s=5.0, what="one too many")
        assert calls.refused == 1
        release.set()
        assert await stuck is True

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        calls.close()
