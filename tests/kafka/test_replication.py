"""DelayedProduce (acks=all, idempotent) on a 3-broker cluster (RF 3, min.insync.replicas 2) with
followers stopped and paused, and the leader killed, frozen and bounced mid-request.

Node 1 leads the test partition of :func:`replicated_topic`; the faults hit the followers 2 and 3.
The leader-fault tests use partitions led by node 2. Each test leaves all three brokers running
and in the ISR. What the leader-fault tests pin is the produce contract under the new mechanism:
a record answered delivered is in the log at its offset, exactly once, in its request's order —
the property the acks=1 design needed an epoch fence and a read-back for (a record a leader
change discarded, a deposed leader's append), here kept by the leader's own purgatory and the
idempotent producer's retries.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from purgatory.adapters.kafka import (
    ClusterView,
    ErrorCode,
    KafkaPurgatory,
    LocalKafkaCluster,
    ProducerRecord,
    TopicPartitionKey,
)

from purgatory import Outcome

from .conftest import WAIT_S
from .kafka_fixtures import (
    FOLLOWERS,
    replicated_topic,
    restore_followers,
    wait_isr,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def replicated(kafka_cluster3: LocalKafkaCluster) -> Iterator[tuple[KafkaPurgatory, TopicPartitionKey]]:
    """A fresh RF-3 topic led by node 1 and a purgatory watching it; brokers restored afterwards."""
    settings, key = replicated_topic(kafka_cluster3, "rep")
    service = KafkaPurgatory.connect(settings, name="replication")
    # Warm the producer while every broker answers: it then knows the leader and is connected,
    # so a produce during a fault never waits on metadata from a frozen broker.
    warm = service.produce([ProducerRecord(key.topic, b"warm-up", partition=0)])
    assert warm.wait(WAIT_S) and warm.succeeded, warm.statuses
    try:
        yield service, key
    finally:
        service.close()
        restore_followers(kafka_cluster3, settings, key)


def test_produce_completes_only_after_followers_replicate(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    kp, key = replicated
    # Not the fixture's 2 s admin timeout: this is the cluster's first admin client of the run, and
    # its first leader lookup on a freshly started 3-broker cluster took longer than that on CI.
    view = ClusterView(kp.settings, request_timeout_ms=int(WAIT_S * 1000))
    try:
        before = view.high_watermarks([key])[key]
        for node in FOLLOWERS:
            kafka_cluster3.pause_broker(node)  # followers frozen: the leader appends, nobody replicates
        op = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=30_000)
        # The leader's purgatory holds the acks=all request: nothing acknowledges it meanwhile.
        # (A bounded look for an answer that must not come; the leader itself says nothing.)
        assert not op.wait(2.0), "acknowledged while no follower could have the record"
        assert view.high_watermarks([key])[key] == before, "the high watermark cannot move either"
        for node in FOLLOWERS:
            kafka_cluster3.resume_broker(node)
        assert op.wait(WAIT_S)
    finally:
        view.close()
    assert op.outcome is Outcome.COMPLETED and op.statuses == {key: ErrorCode.NONE}
    assert op.result().offsets == (before,), "the record is at the offset the high watermark was at"


def test_produce_still_completes_with_one_follower_stopped(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    kp, key = replicated
    kafka_cluster3.stop_broker(3)
    wait_isr(kp.settings, key, 2)
    op = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=15_000)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.COMPLETED and op.statuses == {key: ErrorCode.NONE}, "ISR 2 >= min.insync 2"


def test_produce_rides_out_an_isr_below_min_insync_and_completes_once_followers_return(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    """ISR 1 < min.insync.replicas 2: the leader refuses the append (NOT_ENOUGH_REPLICAS, retriable);
    the producer retries within the request's timeout, as a plain acks=all producer does, and the
    same request completes once the followers are back — no error for a fault shorter than it."""
    kp, key = replicated
    kafka_cluster3.stop_broker(2)
    kafka_cluster3.stop_broker(3)
    wait_isr(kp.settings, key, 1)
    op = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=120_000)
    assert not op.wait(2.0), "acknowledged with one in-sync replica of min.insync.replicas 2"
    kafka_cluster3.start_broker(2)
    kafka_cluster3.start_broker(3)
    assert op.wait(90.0)
    assert op.outcome is Outcome.COMPLETED and op.statuses == {key: ErrorCode.NONE}, op.statuses


def test_produce_expires_with_request_timed_out_while_two_followers_hang(
    kafka_cluster3: LocalKafkaCluster, replicated: tuple[KafkaPurgatory, TopicPartitionKey]
) -> None:
    kp, key = replicated
    for node in FOLLOWERS:
        kafka_cluster3.pause_broker(node)  # hung, not yet dropped from the ISR (replica.lag.time.max.ms 4 s)
    op = kp.produce([ProducerRecord(key.topic, b"r", partition=0)], delay_ms=1000)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED and op.statuses == {key: ErrorCode.REQUEST_TIMED_OUT}
    assert op.result().offsets == (None,) and not op.result().succeeded


def test_a_node_killed_in_a_running_cluster_restarts_from_the_state_file_and_rejoins_the_isr(
    kafka_cluster3: LocalKafkaCluster,
) -> None:
    """``from_state(dir).start_broker(n)`` once failed with ClassNotFoundException kafka.Kafka:
    the handle rebuilt from the state file had no classpath."""
    settings, key = replicated_topic(kafka_cluster3, "restart")
    assert kafka_cluster3.work_dir is not None
    handle = LocalKafkaCluster.from_state(kafka_cluster3.work_dir)
    handle.kill_broker(2)
    try:
        wait_isr(settings, key, 2)
        handle.start_broker(2)
        assert handle.node(2).is_running(), handle.node(2).log_tail()
        wait_isr(settings, key, 3)
    finally:
        # Hand node 2 back to the fixture's handle, which stops the cluster after the module.
        handle.stop_broker(2)
        kafka_cluster3.start_broker(2)
        wait_isr(settings, key, 3)
