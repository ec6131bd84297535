"""The push feed (docs/design.md §8): watched partitions tailed by a real consumer, on real Kafka.

Most tests set ``feed_refresh_ms`` to a minute: once the tail follows a partition the feed does
not poll it again within the test, so a completion can only have come from the tail's push.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from purgatory.adapters.kafka import (
    Appended,
    ChangeFeed,
    ClusterView,
    DelayedFetch,
    DelayedReplication,
    ErrorCode,
    LocalKafkaCluster,
    ProducerRecord,
    SharedReadReader,
    TopicPartitionKey,
    UnknownTopicError,
)
from purgatory.adapters.kafka.facts._facts import ClusterFacts
from purgatory.adapters.kafka.facts._tail import TailedPosition
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import DelayedOperationPurgatory, Outcome

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import RecordAppender, TopicFactory, create_topic, replicated_topic, wait_isr

pytestmark = pytest.mark.kafka

NO_POLL_MS = 60_000  # longer than any test: after the first polls, only the tail can wake a key


@contextmanager
def _push_feed(
    settings: KafkaSettings, refresh_ms: int = NO_POLL_MS
) -> Iterator[tuple[ChangeFeed, DelayedOperationPurgatory[DelayedFetch], SharedReadReader]]:
    pushed = settings.model_copy(update={"feed_mode": "push", "feed_refresh_ms": refresh_ms})
    reader = SharedReadReader(pushed)
    view = ClusterView(pushed)
    feed = ChangeFeed(view, settings=pushed, name=f"push-{uuid.uuid4().hex[:6]}", records=reader)
    purgatory: DelayedOperationPurgatory[DelayedFetch] = DelayedOperationPurgatory(feed.name)
    feed.attach(purgatory)
    feed.start()
    try:
        yield feed, purgatory, reader
    finally:
        feed.stop()
        feed.detach(purgatory)
        purgatory.shutdown()
        reader.close()
        view.close()


def _wait_followed(feed: ChangeFeed, key: TopicPartitionKey) -> None:
    tail = feed.tail
    assert tail is not None, "push mode builds a tail"
    wait_until(lambda: tail.following(key), f"the tail follows {key.label}")


def _produce(settings: KafkaSettings, key: TopicPartitionKey, *values: bytes) -> None:
    producer = RecordAppender(settings)
    try:
        producer.produce([ProducerRecord(key.topic, v, None, key.partition) for v in values])
    finally:
        producer.close()


def test_records_arriving_are_pushed_and_answer_a_long_poll_from_memory(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    key = TopicPartitionKey(kafka_topic_factory(1), 0)
    finished_on: list[str] = []
    with _push_feed(kafka_settings) as (feed, purgatory, reader):
        op = DelayedFetch(
            feed,
            reader,
            {key: 0},
            max_wait_ms=60_000,
            on_response=lambda _op: finished_on.append(threading.current_thread().name),
        )
        purgatory.try_complete_else_watch(op, op.watch_keys())
        _wait_followed(feed, key)
        _produce(kafka_settings, key, b"pushed")
        assert op.wait(WAIT_S), "the record's fetch response wakes the long poll"
    assert finished_on == [f"kafka-tail-{feed.name}"], "completed by the tail's push, not by a poll"
    assert op.outcome is Outcome.COMPLETED and [r.value for r in op.records[key]] == [b"pushed"]
    assert reader.kafka_reads == 0 and reader.pushed_records == 1, "answered from the pushed records"


def test_a_fetch_behind_the_tail_reads_its_records_from_kafka_and_the_next_from_memory(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    """A slow client (offset behind the tail's start) gets the old records read from the log."""
    key = TopicPartitionKey(kafka_topic_factory(1), 0)
    _produce(kafka_settings, key, b"old-0", b"old-1")
    with _push_feed(kafka_settings) as (feed, purgatory, reader):
        waiting = DelayedFetch(feed, reader, {key: 2}, max_wait_ms=60_000)
        purgatory.try_complete_else_watch(waiting, waiting.watch_keys())
        _wait_followed(feed, key)
        behind = DelayedFetch(feed, reader, {key: 0}, min_records=2, max_wait_ms=60_000)
        purgatory.try_complete_else_watch(behind, behind.watch_keys())
        assert behind.wait(WAIT_S)
        assert [r.value for r in behind.records[key]] == [b"old-0", b"old-1"]
        assert reader.kafka_reads == 1, "records before the tail's start come from Kafka"
        _produce(kafka_settings, key, b"new-2")
        assert waiting.wait(WAIT_S)
    assert [r.value for r in waiting.records[key]] == [b"new-2"]
    assert reader.kafka_reads == 1, "the record the tail pushed was read from memory"


def test_a_partition_deleted_while_watched_fails_its_fetch_with_unknown_topic(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    from confluent_kafka.admin import AdminClient

    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    with _push_feed(kafka_settings, refresh_ms=500) as (feed, purgatory, reader):
        op = DelayedFetch(feed, reader, {key: 0}, max_wait_ms=60_000)
        purgatory.try_complete_else_watch(op, op.watch_keys())
        _wait_followed(feed, key)
        admin = AdminClient({"bootstrap.servers": kafka_settings.bootstrap_servers or ""})
        for future in admin.delete_topics([topic], request_timeout=30).values():
            future.result(timeout=30)
        assert op.wait(WAIT_S), "the deletion finishes the fetch, long before its max wait"
        assert feed.tail is not None and feed.tail.is_alive(), "the tail survives the lost partition"
    assert isinstance(op.error, UnknownTopicError), op.error


def test_poll_mode_is_the_fallback_and_still_completes(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    key = TopicPartitionKey(kafka_topic_factory(1), 0)
    polled = kafka_settings.model_copy(update={"feed_mode": "poll"})
    view = ClusterView(polled)
    feed = ChangeFeed(view, settings=polled, name="poll-fallback")
    purgatory: DelayedOperationPurgatory[DelayedReplication] = DelayedOperationPurgatory("poll-fallback")
    feed.attach(purgatory)
    try:
        feed.start()
        assert feed.tail is None and feed.refresh_ms == feed.interval_ms
        op = DelayedReplication(feed, {key: 0}, delay_ms=60_000)
        purgatory.try_complete_else_watch(op, op.watch_keys())
        _produce(kafka_settings, key, b"polled")
        assert op.wait(WAIT_S) and op.succeeded
    finally:
        feed.stop()
        feed.detach(purgatory)
        purgatory.shutdown()
        view.close()


# -- three brokers: the tail follows leaders that move ---------------------------------------------

LED_BY = 2  # not node 1, the controller: stopping it must leave the cluster able to elect


@pytest.fixture
def moving_leader(kafka_cluster3: LocalKafkaCluster) -> Iterator[tuple[KafkaSettings, TopicPartitionKey]]:
    settings = KafkaSettings(bootstrap_servers=kafka_cluster3.bootstrap_servers, request_timeout_ms=2000)
    topic = create_topic(
        kafka_cluster3.bootstrap_servers, f"push-{uuid.uuid4().hex[:8]}", replica_assignment=[[LED_BY, 3, 1]]
    )
    key = TopicPartitionKey(topic, 0)
    wait_isr(settings, key, 3)
    try:
        yield settings, key
    finally:
        if not kafka_cluster3.node(LED_BY).is_running():
            kafka_cluster3.start_broker(LED_BY)
        wait_isr(settings, key, 3)


def _leader(settings: KafkaSettings, key: TopicPartitionKey) -> int:
    view = ClusterView(settings)
    try:
        return view.facts([key]).partitions[key].leader
    finally:
        view.close()


def test_leader_change_and_broker_restart_keep_the_tail_pushing(
    kafka_cluster3: LocalKafkaCluster, moving_leader: tuple[KafkaSettings, TopicPartitionKey]
) -> None:
    settings, key = moving_leader
    with _push_feed(settings, refresh_ms=500) as (feed, purgatory, reader):
        # Keeps the partition watched (so tailed) across the whole test: it wants 3 records.
        anchor = DelayedFetch(feed, reader, {key: 0}, min_records=3, max_wait_ms=60_000)
        purgatory.try_complete_else_watch(anchor, anchor.watch_keys())
        first = DelayedFetch(feed, reader, {key: 0}, max_wait_ms=60_000)
        purgatory.try_complete_else_watch(first, first.watch_keys())
        _wait_followed(feed, key)
        kafka_cluster3.stop_broker(LED_BY)  # the leader goes: node 3 takes over
        wait_until(lambda: _leader(settings, key) not in (LED_BY, -1), "a new leader for the partition")
        _produce(settings, key, b"after-leader-change")
        assert first.wait(WAIT_S), "records on the new leader reach the tail"
        assert [r.value for r in first.records[key]] == [b"after-leader-change"]

        kafka_cluster3.start_broker(LED_BY)  # the old leader comes back (a restart)
        wait_isr(settings, key, 3)
        second = DelayedFetch(feed, reader, {key: 1}, max_wait_ms=60_000)
        purgatory.try_complete_else_watch(second, second.watch_keys())
        _produce(settings, key, b"after-restart")
        assert second.wait(WAIT_S), "the tail keeps pushing across the restart"
        tail = feed.tail
        assert tail is not None and tail.is_alive() and tail.following(key)
        wait_until(lambda: tail.stats.records >= 2, "both records reach the tail")
    # While the partition is degraded the feed polls it every interval too: either path may
    # complete these two (the tail's records above prove it followed the leader and the restart).
    assert [r.value for r in second.records[key]] == [b"after-restart"]


def test_a_tail_position_written_by_a_newer_leader_is_withheld_so_a_produce_cannot_count_it(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    """The acks=1 hole through the push path (CI caught it: tests/service/test_replication_http.py).

    librdkafka's consumer follows a new leader silently, so the tail may read records a leader
    appended that the facts do not know yet. Published onto the old epoch's facts, that position
    would let DelayedReplication count the new leader's records at an offset whose own record the old
    leader took with it. Here the tail's position is forged to be from the next epoch."""
    key = TopicPartitionKey(kafka_topic_factory(1), 0)
    with _push_feed(kafka_settings) as (feed, purgatory, reader):
        produces: DelayedOperationPurgatory[DelayedReplication] = DelayedOperationPurgatory("produces")
        feed.attach(produces)
        try:
            anchor = DelayedFetch(feed, reader, {key: 0}, max_wait_ms=60_000)  # keeps the key watched
            purgatory.try_complete_else_watch(anchor, anchor.watch_keys())
            wait_until(lambda: _epoch_known(feed, key), "a poll gives the partition's facts")
            facts = feed.partition(key)
            assert facts is not None and facts.leader_epoch is not None and facts.high_watermark is not None
            epoch, high = facts.leader_epoch, facts.high_watermark
            produce = DelayedReplication(feed, Appended({key: high}, {key: epoch}), delay_ms=60_000)
            produces.try_complete_else_watch(produce, produce.watch_keys())

            feed._pushed({key: TailedPosition(high + 5, epoch + 1)})
            after = feed.partition(key)
            assert after is not None and after.high_watermark == high, "withheld: not published"
            assert feed.stats.pushes_withheld == 1
            assert not produce.is_completed(), "another leader's records must not answer the produce"

            feed._pushed({key: TailedPosition(high + 1, epoch)})  # the same leader's: published
            assert produce.wait(WAIT_S) and produce.statuses == {key: ErrorCode.NONE}
        finally:
            feed.detach(produces)
            produces.shutdown()


def _epoch_known(feed: ChangeFeed, key: TopicPartitionKey) -> bool:
    facts = feed.partition(key)
    return facts is not None and facts.leader_epoch is not None and facts.high_watermark is not None


class _PolledBeforeReplication(ClusterView):
    """The poll's race with the followers, made to last: every ListOffsets answer for ``key``
    predates the replication of the record at ``offset`` (high watermark capped at it), as when
    the feed polled a freshly watched produce before the followers fetched it. Only the tail can
    then tell the feed the record is replicated."""

    def __init__(self, settings: KafkaSettings, key: TopicPartitionKey, offset: int) -> None:
        super().__init__(settings)
        self._key, self._offset = key, offset

    def facts(self, *args: Any, **kwargs: Any) -> ClusterFacts:
        facts = super().facts(*args, **kwargs)
        polled = facts.partitions.get(self._key)
        if polled is not None and polled.high_watermark is not None:
            capped = min(polled.high_watermark, self._offset)
            facts.partitions[self._key] = dataclasses.replace(polled, high_watermark=capped)
        return facts


def test_a_produce_replicated_before_its_partition_is_tailed_is_answered_by_a_push(
    kafka_cluster3: LocalKafkaCluster,
) -> None:
    """A lone produce on an RF-3 topic used to wait for the refresh poll (~500 ms, docs/performance.md).

    The followers may fetch the record before the tail starts following the partition; a tail
    started at the end then sits past the record and no fetch response ever carries it. Started
    one record before the end, it reads that record and pushes a position (with its epoch) that
    covers it."""
    settings, key = replicated_topic(kafka_cluster3, "push-lone")
    _produce(settings, key, b"replicated-before-tailed")  # offset 0
    view = ClusterView(settings)
    try:
        wait_until(lambda: view.facts([key]).partitions[key].high_watermark == 1, "the followers fetch it")
        facts = view.facts([key]).partitions[key]
    finally:
        view.close()
    assert facts.leader_epoch is not None
    pushed = settings.model_copy(update={"feed_mode": "push", "feed_refresh_ms": NO_POLL_MS})
    stale = _PolledBeforeReplication(pushed, key, offset=0)
    feed = ChangeFeed(stale, settings=pushed, name=f"push-{uuid.uuid4().hex[:6]}")
    produces: DelayedOperationPurgatory[DelayedReplication] = DelayedOperationPurgatory(feed.name)
    feed.attach(produces)
    feed.start()
    try:
        produce = DelayedReplication(feed, Appended({key: 0}, {key: facts.leader_epoch}), delay_ms=60_000)
        produces.try_complete_else_watch(produce, produce.watch_keys())
        assert produce.wait(WAIT_S), "the tail pushed the position covering the record"
        assert produce.statuses == {key: ErrorCode.NONE}
        tail = feed.tail
        assert tail is not None and tail.stats.records >= 1 and tail.stats.pushes >= 1
        assert feed.stats.pushes_withheld == 0
    finally:
        feed.stop()
        feed.detach(produces)
        produces.shutdown()
        stale.close()
