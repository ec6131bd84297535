"""DelayedProduce on a 3-broker cluster (RF 3, min.insync.replicas 2) with followers stopped and paused.

Node 1 is the controller and, by the replica assignment, the leader of the test partition; the
faults hit the followers 2 and 3. Each test leaves all three brokers running and in the ISR.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from purgatory.adapters.kafka import (
    ClusterView,
    DelayedDeleteRecords,
    DelayedProduce,
    ErrorCode,
    KafkaPurgatory,
    LocalKafkaCluster,
    ProducerRecord,
    TopicPartitionKey,
)

from purgatory import Outcome

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import FOLLOWERS, replicated_topic, restore_followers, wait_isr

pytestmark = pytest.mark.kafka


@pytest.fixture
def replicated(kafka_cluster3: LocalKafkaCluster) -> Iterator[tuple[KafkaPurgatory, TopicPartitionKey]]:
    """A fresh RF-3 topic led by node 1 and a purgatory watching it; brokers restored afterwards."""
    settings, key = replicated_topic(kafka_cluster3, "rep")
    service = KafkaPurgatory.connect(settings, name="replication")
    # Warm the producer while every broker answers: it then knows the leader and is connected,
    # so a produce during a fault never waits on metadata from a frozen broker.
    service.producer.produce([ProducerRecord(key.topic, b"warm-up", partition=0)])
    try:
        yield service, key
    finally:
        service.close()
        restore_followers(kafka_cluster3, settings, key)


def test_produce_completes_only_after_followers_replicate(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    kp, key = replicated
    for node in FOLLOWERS:
        kafka_cluster3.pause_broker(node)  # followers frozen: the leader appends, nobody replicates
    op = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=15_000)
    offset = op.appended[key]
    # Asked of the leader directly (ListOffsets goes to node 1, which is running): while the
    # followers are frozen the high watermark cannot pass the record, and the op must wait.
    # (The feed may be stalled meanwhile: its DescribeTopics can land on a frozen broker.)
    high = ClusterView(kp.settings).high_watermarks([key])[key]
    assert high <= offset, f"followers frozen: high watermark {high} has not passed offset {offset}"
    assert not op.is_completed(), "the leader has the record but the followers do not: not replicated yet"
    for node in FOLLOWERS:
        kafka_cluster3.resume_broker(node)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED and op.statuses == {key: ErrorCode.NONE}


def test_produce_still_completes_with_one_follower_stopped(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    kp, key = replicated
    kafka_cluster3.stop_broker(3)
    wait_isr(kp.settings, key, 2)
    op = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=15_000)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED and op.statuses == {key: ErrorCode.NONE}, "ISR 2 >= min.insync 2"


def test_produce_reports_not_enough_replicas_with_two_followers_stopped_and_recovers_after_restart(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    kp, key = replicated
    kafka_cluster3.stop_broker(2)
    kafka_cluster3.stop_broker(3)
    wait_isr(kp.settings, key, 1)
    op = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=15_000)
    assert op.wait(WAIT_S)
    assert op.statuses == {key: ErrorCode.NOT_ENOUGH_REPLICAS}, "ISR 1 < min.insync.replicas 2"

    # Keep the partition watched (the feed polls watched keys only) while the followers return,
    # with an operation that cannot finish meanwhile (a produce would: NOT_ENOUGH_REPLICAS).
    kp.submit(DelayedDeleteRecords(kp.feed, {key: 10**9}, delay_ms=60_000), validate=False)
    kafka_cluster3.start_broker(2)
    kafka_cluster3.start_broker(3)
    wait_isr(kp.settings, key, 3)
    # Operations judge by the feed's snapshot: wait until it, too, has seen the ISR recover.
    wait_until(lambda: len(getattr(kp.feed.partition(key), "isr", ())) == 3, "the feed saw ISR 3")
    again = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=15_000)
    assert again.wait(WAIT_S)
    assert again.outcome is Outcome.COMPLETED and again.statuses == {key: ErrorCode.NONE}


def test_produce_expires_with_request_timed_out_while_two_followers_hang(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    kp, key = replicated
    for node in FOLLOWERS:
        kafka_cluster3.pause_broker(node)  # hung, not yet dropped from the ISR (replica.lag.time.max.ms 4 s)
    appended = kp.producer.produce([ProducerRecord(key.topic, b"r", partition=0)])
    # validate=False: DescribeTopics may be routed to a frozen broker (the "controller" it was told).
    op = kp.submit(DelayedProduce(kp.feed, appended, delay_ms=1000), validate=False)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED and op.statuses == {key: ErrorCode.REQUEST_TIMED_OUT}
