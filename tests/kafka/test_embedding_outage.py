"""Kafka-side conditions come back as statuses in each call's result, never as exceptions
(issue "Embedding in practice", items 1 and 2): a stopped broker, a partition that does not
exist, a group that never committed. One dedicated broker, stopped and started by these tests.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from purgatory.adapters.kafka import (
    AsyncKafkaPurgatory,
    ErrorCode,
    KafkaPurgatory,
    KafkaUnavailableError,
    LocalKafkaCluster,
    ProducerRecord,
    TopicPartitionKey,
    UnknownTopicError,
)
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import Outcome, PurgatoryClosedError
from purgatory.settings import Settings

from .kafka_fixtures import WAIT_S, create_topic

pytestmark = pytest.mark.kafka

TOPIC = "uj-orders"  # the topic: three partitions
CALL_TIMEOUT_MS = 3_000  # each call's own deadline during the outage
REQUEST_TIMEOUT_MS = 1_000  # the cluster view's bound: the feed notices the outage within it
AT_ONCE_S = 2.0  # "at once": one DescribeTopics round trip, nowhere near the call's timeout


@pytest.fixture(scope="module")
def cluster(kafka_cluster1: LocalKafkaCluster) -> LocalKafkaCluster:
    """The module's own broker (the tests stop it), with the topic every test uses."""
    create_topic(kafka_cluster1.bootstrap_servers, TOPIC, partitions=3)
    return kafka_cluster1


def _settings(cluster: LocalKafkaCluster) -> Settings:
    return Settings(
        kafka=KafkaSettings(
            bootstrap_servers=cluster.bootstrap_servers,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            produce_timeout_ms=CALL_TIMEOUT_MS,
        )
    )


async def test_a_partition_that_does_not_exist_is_answered_at_once(cluster: LocalKafkaCluster) -> None:
    missing = TopicPartitionKey(TOPIC, 7)
    async with KafkaPurgatory.connect(_settings(cluster), metrics=False) as kp:
        started = time.monotonic()
        committed = await kp.wait_committed("billing", {missing: 1}, timeout_ms=30_000)
        took = time.monotonic() - started
        fetched = await kp.fetch({missing: 0}, max_wait_ms=30_000)
    assert took < AT_ONCE_S, f"answered at once, not at the 30 s timeout ({took:.1f} s)"
    assert committed.statuses == {missing: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert isinstance(committed.error, UnknownTopicError) and "partition 7" in str(committed.error)
    assert "3 partitions" in str(committed.error), "the error says what exists"
    assert fetched.statuses == {missing: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


async def test_a_group_that_never_committed_says_so(cluster: LocalKafkaCluster) -> None:
    key = TopicPartitionKey(TOPIC, 0)
    async with KafkaPurgatory.connect(_settings(cluster), metrics=False) as kp:
        result = await kp.wait_committed("never-seen-group", {key: 1}, timeout_ms=1_500)
    assert result.outcome is Outcome.EXPIRED and result.statuses == {key: ErrorCode.REQUEST_TIMED_OUT}
    assert result.uncommitted == {key} and result.nothing_committed, "no committed offset at all"
    assert result.committed == {key: None}


async def _each_call(kp: AsyncKafkaPurgatory) -> dict[str, object]:
    key = TopicPartitionKey(TOPIC, 0)
    calls = {
        "produce": kp.produce([ProducerRecord(TOPIC, b"x", partition=0)], timeout_ms=CALL_TIMEOUT_MS),
        "fetch": kp.fetch({key: 0}, max_wait_ms=CALL_TIMEOUT_MS),
        "wait_committed": kp.wait_committed("billing", {key: 1}, CALL_TIMEOUT_MS),
        "wait_topic_ready": kp.wait_topic_ready(TOPIC, CALL_TIMEOUT_MS),
        "delete_records": kp.delete_records({key: 0}, CALL_TIMEOUT_MS),
        "create_topic": kp.create_topic("uj-new", partitions=1, timeout_ms=CALL_TIMEOUT_MS),
    }
    results = await asyncio.wait_for(asyncio.gather(*calls.values()), WAIT_S)
    return dict(zip(calls, results, strict=True))


async def test_every_call_answers_a_status_while_the_broker_is_down(cluster: LocalKafkaCluster) -> None:
    key = TopicPartitionKey(TOPIC, 0)
    async with KafkaPurgatory.connect(_settings(cluster), metrics=False) as kp:
        cluster.stop_broker(1)
        try:
            results = await _each_call(kp)  # none raises: that is the first assertion
        finally:
            cluster.start_broker(1)
        after = await kp.fetch({key: 0}, min_records=0, max_wait_ms=CALL_TIMEOUT_MS)

    produced = results["produce"]
    assert produced.record_statuses == (ErrorCode.REQUEST_TIMED_OUT,), "not known whether written"  # type: ignore[attr-defined]
    for name in ("fetch", "wait_committed", "delete_records"):
        result = results[name]
        assert result.statuses == {key: ErrorCode.KAFKA_UNAVAILABLE}, f"{name}: {result}"  # type: ignore[attr-defined]
        assert result.unavailable and not result.succeeded, name  # type: ignore[attr-defined]
        assert not isinstance(result.error, UnknownTopicError), f"{name}: an outage is not a missing topic"  # type: ignore[attr-defined]
        assert isinstance(result.error, KafkaUnavailableError), name  # type: ignore[attr-defined]
    for name in ("wait_topic_ready", "create_topic"):
        result = results[name]
        assert result.status is ErrorCode.KAFKA_UNAVAILABLE and not result.ready, f"{name}: {result}"  # type: ignore[attr-defined]
    assert after.statuses == {key: ErrorCode.NONE}, "served again once the broker is back"


async def test_a_purgatory_closed_while_calls_wait_answers_them_shutting_down(
    cluster: LocalKafkaCluster,
) -> None:
    key = TopicPartitionKey(TOPIC, 0)
    kp = KafkaPurgatory.connect(_settings(cluster), metrics=False).aio
    waiting = [
        asyncio.ensure_future(kp.wait_committed("billing", {key: 10**6}, 60_000)),
        asyncio.ensure_future(kp.fetch({key: 0}, min_records=10**6, max_wait_ms=60_000)),
        asyncio.ensure_future(kp.wait_topic_ready("uj-never", 60_000)),
    ]
    while sum(p.num_delayed() for p in kp.purgatories.values()) < len(waiting):
        await asyncio.sleep(0.01)  # the submissions have no event of their own to await
    started = time.monotonic()
    await kp.aclose()
    results = await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
    assert time.monotonic() - started < 1.0, "closing answers every pending call within a second"
    assert all(r.shutting_down for r in results), results
    with pytest.raises(PurgatoryClosedError):
        await kp.wait_committed("billing", {key: 1}, 1_000)  # after close(): the caller's mistake
