"""Each Kafka-backed operation completes when its condition happens and expires with its status when not."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from purgatory.adapters.kafka import (
    DelayedConsumerCommit,
    DelayedDeleteRecords,
    DelayedFetch,
    DelayedReplication,
    DelayedTopicReady,
    ErrorCode,
    GroupFacts,
    GroupPartitionKey,
    InvalidOffsetError,
    KafkaPurgatory,
    ProducerRecord,
    TopicPartitionKey,
    UnknownTopicError,
)

from purgatory import Outcome

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import RecordAppender, TopicFactory, create_topic

pytestmark = pytest.mark.kafka


def _append(kp: KafkaPurgatory, topic: str, partition: int, n: int = 1, size: int = 5) -> int:
    """Produce ``n`` records of ``size`` bytes; return the last offset."""
    offsets = RecordAppender(kp.settings).produce(
        [ProducerRecord(topic, b"x" * size, partition=partition) for _ in range(n)]
    )
    return offsets[TopicPartitionKey(topic, partition)]


def _high(kp: KafkaPurgatory, key: TopicPartitionKey) -> int | None:
    facts = kp.feed.partition(key)
    return facts.high_watermark if facts is not None else None


# -- DelayedProduce and DelayedReplication ------------------------------------------------------


def test_produce_completes_once_kafka_acknowledged_every_record(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(3)
    op = kp.produce([ProducerRecord(topic, b"a", partition=p) for p in range(3)], delay_ms=10_000)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED
    assert op.statuses == {TopicPartitionKey(topic, p): ErrorCode.NONE for p in range(3)}
    assert op.succeeded and op.error is None
    result = op.result()
    assert result.record_statuses == (ErrorCode.NONE,) * 3 and result.delivered == 3
    assert result.appended == {TopicPartitionKey(topic, p): o for p, o in enumerate(result.offsets)}


def test_produce_carries_each_records_headers_to_kafka_in_order(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory, kafka_bootstrap: str
) -> None:
    topic = kafka_topic_factory(1)
    headers = (("trace", b"t-1"), ("trace", b"t-2"), ("empty", None))
    op = kp.produce(
        [ProducerRecord(topic, b"a", partition=0, headers=headers), ProducerRecord(topic, b"b", partition=0)]
    )
    assert op.wait(WAIT_S) and op.succeeded, op.statuses
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": "headers", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = consumer.consume(2, timeout=WAIT_S)
    finally:
        consumer.close()
    assert [m.value() for m in messages] == [b"a", b"b"]
    assert messages[0].headers() == list(headers), "names repeat, order kept, a None value stays None"
    assert messages[1].headers() is None


def test_replication_expires_with_request_timed_out_when_the_high_watermark_never_passes(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    last = _append(kp, topic, 0)
    # Partition 1 "appended" an offset the log never reaches: its status must time out.
    appended = {TopicPartitionKey(topic, 0): last, TopicPartitionKey(topic, 1): 100}
    op = kp.submit(DelayedReplication(kp.feed, appended, delay_ms=400))
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED
    assert op.statuses == {
        TopicPartitionKey(topic, 0): ErrorCode.NONE,
        TopicPartitionKey(topic, 1): ErrorCode.REQUEST_TIMED_OUT,
    }
    assert not op.succeeded


def test_replication_of_an_unknown_topic_is_answered_unknown_at_once(kp: KafkaPurgatory) -> None:
    key = TopicPartitionKey("no-such-topic-p", 0)
    op = kp.submit(DelayedReplication(kp.feed, {key: 0}))
    assert op.done.is_set() and op.statuses == {key: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert isinstance(op.error, UnknownTopicError) and "no-such-topic-p" in str(op.error)
    assert all(p.watched() == 0 for p in kp.purgatories.values()), "nothing was watched"


# -- DelayedFetch --------------------------------------------------------------------------------


def test_fetch_waits_for_min_records_then_returns_them(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    op = kp.fetch({key: 0}, min_records=3, max_wait_ms=15_000)
    _append(kp, topic, 0, n=2)
    wait_until(lambda: _high(kp, key) == 2, "the feed saw the two records")
    assert not op.is_completed(), "two records are fewer than min_records=3"
    _append(kp, topic, 0, n=1)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED
    assert [r.offset for r in op.records[key]] == [0, 1, 2]
    assert op.statuses[key] is ErrorCode.NONE


def test_fetch_with_min_bytes_completes_once_enough_bytes_arrived(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    offsets = {TopicPartitionKey(topic, 0): 0, TopicPartitionKey(topic, 1): 0}
    op = kp.fetch(offsets, min_bytes=100, max_wait_ms=15_000)
    _append(kp, topic, 0, n=1, size=60)
    wait_until(lambda: _high(kp, TopicPartitionKey(topic, 0)) == 1, "the feed saw the first record")
    assert not op.is_completed(), "60 bytes are fewer than min_bytes=100"
    _append(kp, topic, 1, n=1, size=60)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED
    assert sum(r.size for rs in op.records.values() for r in rs) == 120


def test_fetch_expires_after_max_wait_with_what_arrived(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    _append(kp, topic, 0, n=1)
    op = kp.fetch({key: 0}, min_records=5, max_wait_ms=300)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED
    assert [r.offset for r in op.records[key]] == [0], "the long poll returns what is there at expiry"


def test_fetch_offset_out_of_range_finishes_at_once_with_invalid_offset_error(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    op = kp.fetch({key: 50}, max_wait_ms=10_000)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED, "finished by the error, not by expiry"
    assert op.statuses[key] is ErrorCode.OFFSET_OUT_OF_RANGE
    assert isinstance(op.error, InvalidOffsetError) and "out of range" in str(op.error)


def test_negative_fetch_offset_is_refused_before_submission(kp: KafkaPurgatory) -> None:
    with pytest.raises(InvalidOffsetError, match="must be an int >= 0"):
        DelayedFetch(kp.feed, kp.reader, {TopicPartitionKey("any", 0): -1})


def test_fetch_on_unknown_topic_is_answered_unknown_at_once(kp: KafkaPurgatory) -> None:
    key = TopicPartitionKey("no-such-topic-f", 0)
    op = kp.fetch({key: 0})
    assert op.done.is_set(), "a status, not an exception, and no wait"
    assert op.result().statuses == {key: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert isinstance(op.error, UnknownTopicError)


async def test_fetch_from_asyncio_returns_the_outcome(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    waiter = asyncio.ensure_future(kp.fetch_async({key: 0}, max_wait_ms=15_000))
    await asyncio.sleep(0)  # let the fetch be submitted before the record lands (order only)
    await asyncio.get_running_loop().run_in_executor(None, _append, kp, topic, 0)
    op = await asyncio.wait_for(waiter, WAIT_S)
    assert op.outcome is Outcome.COMPLETED and [r.offset for r in op.records[key]] == [0]


# -- DelayedConsumerCommit -----------------------------------------------------------------------


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def test_consumer_commit_completes_when_the_group_commits_the_target(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory, kafka_bootstrap: str
) -> None:
    topic = kafka_topic_factory(1)
    group = f"g-{topic}"
    op = kp.submit(DelayedConsumerCommit(kp.feed, group, {TopicPartitionKey(topic, 0): 5}, delay_ms=15_000))
    _commit(kafka_bootstrap, group, topic, 3)
    gkey = GroupPartitionKey(group, topic, 0)
    wait_until(lambda: (kp.feed.group(gkey) or GroupFacts()).committed == 3, "the feed saw the commit of 3")
    assert not op.is_completed(), "committed 3 < target 5"
    _commit(kafka_bootstrap, group, topic, 5)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED
    assert op.committed == {TopicPartitionKey(topic, 0): 5}
    assert op.statuses == {TopicPartitionKey(topic, 0): ErrorCode.NONE}


def test_consumer_commit_expires_when_the_group_does_not_catch_up(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    op = kp.submit(
        DelayedConsumerCommit(kp.feed, f"g-{topic}", {TopicPartitionKey(topic, 0): 1}, delay_ms=300)
    )
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED
    assert op.statuses == {TopicPartitionKey(topic, 0): ErrorCode.REQUEST_TIMED_OUT}


# -- DelayedTopicReady ---------------------------------------------------------------------------


def test_topic_ready_completes_once_the_topic_is_created_with_leaders(
    kp: KafkaPurgatory, kafka_bootstrap: str
) -> None:
    name = f"ready-{id(kp):x}"
    op = kp.submit(DelayedTopicReady(kp.feed, name, delay_ms=15_000))
    assert not op.is_completed(), "the topic does not exist yet"
    create_topic(kafka_bootstrap, name, partitions=3)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED and op.ready and len(op.leaders) == 3


def test_topic_ready_expires_when_the_topic_never_appears(kp: KafkaPurgatory) -> None:
    op = kp.submit(DelayedTopicReady(kp.feed, "never-created-topic", delay_ms=300))
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED and not op.ready


# -- DelayedDeleteRecords ------------------------------------------------------------------------


def test_delete_records_completes_when_log_start_offset_reaches_the_target(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory, kafka_bootstrap: str
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    _append(kp, topic, 0, n=10)
    op = kp.submit(DelayedDeleteRecords(kp.feed, {key: 4}, delay_ms=15_000))
    wait_until(lambda: _high(kp, key) == 10, "the feed polled the partition")
    assert not op.is_completed(), "nothing deleted yet"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(timeout=WAIT_S)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED
    assert op.log_start_offsets == {key: 4} and op.statuses == {key: ErrorCode.NONE}


def test_delete_records_expires_when_the_target_is_not_reached(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    op = kp.submit(DelayedDeleteRecords(kp.feed, {key: 4}, delay_ms=300))
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED
    assert op.statuses == {key: ErrorCode.REQUEST_TIMED_OUT} and op.log_start_offsets == {key: 0}


def test_fetch_with_min_records_zero_answers_at_once(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    op = kp.fetch({TopicPartitionKey(topic, 0): 0}, min_records=0, max_wait_ms=15_000)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED, "min_records=0 is Kafka's min_bytes=0: no waiting"
    assert op.records == {TopicPartitionKey(topic, 0): []}


async def test_produce_from_asyncio_waits_for_replication_without_blocking_the_loop(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    records = [ProducerRecord(topic, b"a", partition=p) for p in range(2)]
    op = await asyncio.wait_for(kp.produce_async(records, delay_ms=10_000), WAIT_S)
    assert op.outcome is Outcome.COMPLETED and op.succeeded


async def test_cancelling_an_awaited_fetch_finishes_it_as_cancelled_and_releases_its_key(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    op = DelayedFetch(kp.feed, kp.reader, {key: 0}, max_wait_ms=15_000)
    task = asyncio.ensure_future(kp.watch(op))

    async def submitted() -> None:
        while key not in kp.feed.watched_keys():  # submitted once the feed counts its key
            await asyncio.sleep(0.01)

    await asyncio.wait_for(submitted(), WAIT_S)
    task.cancel()  # e.g. the HTTP client of a long-poll gateway went away
    with pytest.raises(asyncio.CancelledError):
        await task
    assert op.outcome is Outcome.CANCELLED
    assert kp.feed.watched_keys() == frozenset(), "a cancelled operation releases its key"
