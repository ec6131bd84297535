"""The change feed polls watched keys only, with requests independent of the pending operations."""

from __future__ import annotations

import threading
import time

import pytest
from purgatory.adapters.kafka import (
    DelayedDeleteRecords,
    DelayedReplication,
    KafkaKey,
    KafkaPurgatory,
    ProducerRecord,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.facts._feed import METADATA_EVERY, WAKE_LIMIT
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import DelayedOperationPurgatory, PurgatoryFullError

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import RecordAppender, TopicFactory

pytestmark = pytest.mark.kafka

POLLS_MEASURED = 2 * METADATA_EVERY  # whole metadata cycles: every window holds the same requests


def _requests_per_poll(kp: KafkaPurgatory) -> list[int]:
    """Requests the view sent during each of ``POLLS_MEASURED`` consecutive successful polls."""
    counts: list[int] = []
    done = threading.Event()
    last = [kp.view.requests_sent]

    def observe(_changed: list[KafkaKey]) -> None:
        # Runs on the feed thread right after a poll: the only thread sending requests.
        counts.append(kp.view.requests_sent - last[0])
        last[0] = kp.view.requests_sent
        if len(counts) > POLLS_MEASURED:
            done.set()

    kp.feed.add_observer(observe)
    assert done.wait(WAIT_S), "the feed polls every interval"
    return counts[1 : POLLS_MEASURED + 1]  # the first may include a poll begun before observing


def test_requests_per_interval_do_not_grow_with_pending_operations(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(4)
    keys = [TopicPartitionKey(topic, p) for p in range(4)]

    def submit(n: int) -> None:
        for i in range(n):
            kp.submit(DelayedReplication(kp.feed, {keys[i % 4]: 1_000_000}, delay_ms=60_000), validate=False)

    submit(10)
    few = _requests_per_poll(kp)
    submit(990)
    many = _requests_per_poll(kp)
    # Every poll: ListOffsets(latest); every METADATA_EVERY-th poll also DescribeTopics.
    # DescribeConfigs is cached, and no DelayedReplication reads log start offsets (no "earliest").
    # The first window may hold more: right after the topic was created a partition may still be
    # electing its leader, and a degraded partition is re-described every poll (by design). The
    # later window, with 100 times the operations, must be the plain cycle, and no larger.
    expected = POLLS_MEASURED + POLLS_MEASURED // METADATA_EVERY
    assert sum(many) == expected, f"1000 pending: {many} per poll"
    assert sum(many) <= sum(few), f"10 pending: {few} per poll; 1000 pending: {many}"
    assert set(many) <= {1, 2}
    assert kp.feed.watched_keys() == frozenset(keys), "four keys watched, however many operations"


def test_log_start_offsets_are_polled_only_for_operations_that_read_them(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    produce_key, delete_key = TopicPartitionKey(topic, 0), TopicPartitionKey(topic, 1)
    kp.submit(DelayedReplication(kp.feed, {produce_key: 1_000_000}, delay_ms=60_000))
    kp.submit(DelayedDeleteRecords(kp.feed, {delete_key: 1_000_000}, delay_ms=60_000))
    counts = _requests_per_poll(kp)
    assert sum(counts) == 2 * POLLS_MEASURED + POLLS_MEASURED // METADATA_EVERY, (
        f"ListOffsets latest and earliest every poll, DescribeTopics every {METADATA_EVERY}th: {counts}"
    )
    produce_facts, delete_facts = kp.feed.partition(produce_key), kp.feed.partition(delete_key)
    assert produce_facts is not None and produce_facts.log_start_offset is None
    assert delete_facts is not None and delete_facts.log_start_offset == 0


def test_only_watched_keys_are_polled_and_released_when_their_operations_finish(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(3)
    key = TopicPartitionKey(topic, 1)
    op = kp.submit(DelayedReplication(kp.feed, {key: 0}, delay_ms=15_000))
    wait_until(lambda: kp.feed.partition(key) is not None, "facts of the watched key")
    assert kp.feed.partition(TopicPartitionKey(topic, 0)) is None, "an unwatched partition is not polled"
    RecordAppender(kp.settings).produce([ProducerRecord(topic, b"x", partition=1)])
    assert op.wait(WAIT_S) and op.succeeded
    assert kp.feed.watched_keys() == frozenset(), "the finished operation released its key"
    assert kp.feed.is_alive()


def test_a_refused_submission_releases_its_keys(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    purgatory = DelayedOperationPurgatory("full", max_pending=1)
    with KafkaPurgatory.connect(kafka_settings, purgatory=purgatory) as kp:
        kp.submit(DelayedReplication(kp.feed, {key: 1_000_000}, delay_ms=60_000))
        with pytest.raises(PurgatoryFullError):
            kp.submit(DelayedReplication(kp.feed, {TopicPartitionKey(topic, 0): 2_000_000}, delay_ms=60_000))
        kp.purgatory.shutdown()  # drains the first one
        assert kp.feed.watched_keys() == frozenset(), "no key left counted by the refused operation"
    purgatory.shutdown()


def test_a_stream_of_new_keys_does_not_become_a_stream_of_polls(
    kp: KafkaPurgatory, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(60)
    polls_before, started = kp.feed.stats.polls, time.monotonic()
    for partition in range(60):  # each submission brings a new key, which wakes the feed
        op = DelayedReplication(kp.feed, {TopicPartitionKey(topic, partition): 10**6}, delay_ms=60_000)
        kp.submit(op, validate=False)
        time.sleep(0.002)  # a submission rate well above the poll rate (pacing, not synchronisation)
    elapsed_s = time.monotonic() - started
    polls = kp.feed.stats.polls - polls_before
    intervals = elapsed_s * 1000 / kp.feed.interval_ms
    assert polls <= (intervals + 1) * WAKE_LIMIT, f"{polls} polls in {intervals:.1f} intervals"
