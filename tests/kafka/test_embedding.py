"""KafkaPurgatory as a user embeds it: ``async with connect()``, awaitables with frozen results,
one purgatory per kind of operation, ``aclose()`` that leaves the loop serving (issue 13)."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY, generate_latest
from purgatory.adapters.kafka import (
    AsyncKafkaPurgatory,
    CommitResult,
    DelayedReplication,
    DelayedTopicReady,
    ErrorCode,
    KafkaPurgatory,
    ProduceResult,
    ProducerRecord,
    TopicPartitionKey,
    UnknownTopicError,
)
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import DelayedOperationPurgatory, Outcome, PurgatoryFullError
from purgatory.settings import Settings

from .kafka_fixtures import WAIT_S, TopicFactory

pytestmark = pytest.mark.kafka


def _settings(kafka_settings: KafkaSettings) -> Settings:
    return Settings(kafka=kafka_settings)


def _commit(bootstrap: str, group: str, key: TopicPartitionKey, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(key.topic, key.partition, offset)], asynchronous=False)
    finally:
        consumer.close()


async def test_async_with_connect_creates_produces_fetches_and_waits_for_a_commit(
    kafka_settings: KafkaSettings, kafka_bootstrap: str
) -> None:
    topic = f"embed-{uuid.uuid4().hex[:8]}"
    key = TopicPartitionKey(topic, 0)
    async with KafkaPurgatory.connect(_settings(kafka_settings)) as kp:
        assert isinstance(kp, AsyncKafkaPurgatory)
        ready = await asyncio.wait_for(kp.create_topic(topic, partitions=2, replication_factor=1), WAIT_S)
        assert ready.ready and ready.outcome is Outcome.COMPLETED and len(ready.leaders) == 2

        produced = await asyncio.wait_for(
            kp.produce([ProducerRecord(topic, b"order-1", partition=0)]), WAIT_S
        )
        assert isinstance(produced, ProduceResult)
        assert produced.succeeded and produced.statuses == {key: ErrorCode.NONE}
        offset = produced.appended[key]

        fetched = await asyncio.wait_for(kp.fetch({key: offset}, max_wait_ms=10_000), WAIT_S)
        assert fetched.succeeded and [r.value for r in fetched.records[key]] == [b"order-1"]

        group = f"billing-{topic}"
        waiting = asyncio.ensure_future(kp.wait_committed(group, {key: offset + 1}, timeout_ms=15_000))
        await asyncio.sleep(0)  # submitted before the commit lands (order only; either order completes)
        await asyncio.get_running_loop().run_in_executor(
            None, _commit, kafka_bootstrap, group, key, offset + 1
        )
        committed = await asyncio.wait_for(waiting, WAIT_S)
        assert isinstance(committed, CommitResult)
        assert committed.succeeded and committed.committed == {key: offset + 1}

        names = set(kp.purgatories)
        # connect() registered the collector: no extra call; each kind has its own label.
        exposition = generate_latest(REGISTRY).decode()
    assert {"produce", "fetch", "commit", "topic_ready"} <= names, "one purgatory per kind of operation"
    for name in ("produce", "fetch", "commit"):
        assert f'PurgatorySize{{delayedOperation="{name}"}}' in exposition


async def test_wait_committed_answers_timed_out_when_the_group_never_commits(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    key = TopicPartitionKey(kafka_topic_factory(1), 0)
    async with KafkaPurgatory.connect(_settings(kafka_settings)) as kp:
        result = await asyncio.wait_for(kp.wait_committed("nobody", {key: 1}, timeout_ms=300), WAIT_S)
    assert result.outcome is Outcome.EXPIRED and not result.succeeded
    assert result.statuses == {key: ErrorCode.REQUEST_TIMED_OUT}


async def test_delete_records_answers_once_the_log_start_offset_moved(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    key = TopicPartitionKey(kafka_topic_factory(1), 0)
    async with KafkaPurgatory.connect(_settings(kafka_settings)) as kp:
        await kp.produce([ProducerRecord(key.topic, b"x", partition=0) for _ in range(5)])
        deleted = await asyncio.wait_for(kp.delete_records({key: 3}, timeout_ms=15_000), WAIT_S)
    assert deleted.succeeded and deleted.log_start_offsets[key] == 3


async def test_delete_records_on_an_unknown_topic_is_answered_before_anything_is_sent(
    kafka_settings: KafkaSettings,
) -> None:
    key = TopicPartitionKey("no-such-topic-d", 0)
    async with KafkaPurgatory.connect(_settings(kafka_settings)) as kp:
        result = await asyncio.wait_for(kp.delete_records({key: 1}, timeout_ms=15_000), WAIT_S)
    assert result.statuses == {key: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}, "a status, not an exception"
    assert isinstance(result.error, UnknownTopicError) and "no-such-topic-d" in str(result.error)


def test_create_topic_says_whether_it_created_the_topic(kafka_settings: KafkaSettings) -> None:
    topic = f"embed-{uuid.uuid4().hex[:8]}"
    with KafkaPurgatory.connect(kafka_settings) as kp:
        assert kp.create_topic(topic, partitions=1, replication_factor=1) is True
        assert kp.create_topic(topic, partitions=1, replication_factor=1) is False, "exists already"
        op = kp.topic_ready(topic, timeout_ms=15_000)
        assert op.wait(WAIT_S) and op.result().ready


async def test_aclose_lets_the_loop_serve_while_operations_drain(kafka_settings: KafkaSettings) -> None:
    """A draining operation's callback waits for the loop: a close on the loop thread would hang it."""
    released = threading.Event()
    callback_saw: list[bool] = []
    kp = KafkaPurgatory.connect(kafka_settings)
    op = DelayedTopicReady(
        kp.feed,
        f"never-{uuid.uuid4().hex[:8]}",
        delay_ms=60_000,
        on_response=lambda _op: callback_saw.append(released.wait(5.0)),
    )
    kp.submit(op)
    closing = asyncio.ensure_future(kp.aclose())
    await asyncio.sleep(0)  # aclose starts; with a blocking close this line only returns after it
    released.set()  # the loop runs this while the close drains on another thread
    await asyncio.wait_for(closing, WAIT_S)
    assert op.outcome is Outcome.EXPIRED, "closing drains: the pending operation expired"
    assert callback_saw == [True], "the loop was free while the close drained"


async def test_produce_async_releases_the_feeds_keys_when_the_purgatory_refuses(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    full = DelayedOperationPurgatory[DelayedReplication]("full", max_pending=1)
    try:
        with KafkaPurgatory.connect(kafka_settings, purgatory=full) as kp:
            kp.submit(DelayedReplication(kp.feed, {TopicPartitionKey(topic, 0): 10**6}, delay_ms=60_000))
            with pytest.raises(PurgatoryFullError):
                await kp.produce_async([ProducerRecord(topic, b"x", partition=1)])
            assert TopicPartitionKey(topic, 1) not in kp.feed.watched_keys(), "the refused op's key"
    finally:
        full.shutdown()


def test_connect_without_settings_reads_the_variable_kafka_up_prints(
    kafka_bootstrap: str, kafka_topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = kafka_topic_factory(1)
    monkeypatch.delenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("PURGATORY_CONFIG_FILE", raising=False)
    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", kafka_bootstrap)
    with KafkaPurgatory.connect() as kp:
        assert kp.settings.bootstrap_servers == kafka_bootstrap
        op = kp.produce([ProducerRecord(topic, b"x", partition=0)], delay_ms=10_000)
        assert op.wait(WAIT_S) and op.result().succeeded


async def test_a_fetch_right_after_a_produce_reads_it_and_takes_the_log_end_as_in_range(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    # Kafka's fetch checks its offset against the log itself: after a produce answered offset n,
    # n + 1 is the log end (in range), and a fetch of n that does not wait has the record. The
    # change feed reports the append a few ms after the produce's answer.
    key = TopicPartitionKey(kafka_topic_factory(1), 0)
    async with KafkaPurgatory.connect(_settings(kafka_settings)) as kp:
        await asyncio.wait_for(kp.fetch({key: 0}, max_wait_ms=0), WAIT_S)  # the feed follows the key
        for i in range(20):
            value = f"ryw-{i}".encode()
            produced = await asyncio.wait_for(
                kp.produce([ProducerRecord(key.topic, value, partition=0)]), WAIT_S
            )
            assert produced.succeeded, produced
            offset = produced.appended[key]
            at_end = await asyncio.wait_for(kp.fetch({key: offset + 1}, max_wait_ms=i % 3), WAIT_S)
            assert at_end.statuses == {key: ErrorCode.NONE}, (i, at_end)
            assert at_end.records[key] == []
            mine = await asyncio.wait_for(kp.fetch({key: offset}, max_wait_ms=0), WAIT_S)
            assert [r.value for r in mine.records[key]] == [value], (i, mine)
        beyond = await asyncio.wait_for(kp.fetch({key: offset + 50}, max_wait_ms=30_000), WAIT_S)
        assert beyond.statuses == {key: ErrorCode.OFFSET_OUT_OF_RANGE}, "past the end: at once, as Kafka"
