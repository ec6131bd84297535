"""DelayedProduce on a 3-broker cluster (RF 3, min.insync.replicas 2) with followers stopped and paused.

Node 1 is the controller and, by the replica assignment, the leader of the test partition; the
faults hit the followers 2 and 3 — except in the leader-change test, whose partition is led by
node 2 so that its leader can die while the controller lives. Each test leaves all three brokers
running and in the ISR.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import Producer
from purgatory.adapters.kafka import (
    AppendOutcomeUnknownError,
    ClusterView,
    DelayedDeleteRecords,
    DelayedProduce,
    ErrorCode,
    FetchedRecord,
    KafkaPurgatory,
    KafkaUnavailableError,
    LocalKafkaCluster,
    ProducerRecord,
    TopicPartitionKey,
)

from purgatory import Outcome
from purgatory.settings import KafkaSettings

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import (
    FOLLOWERS,
    STRANDING_REPLICAS,
    StrandedRecord,
    create_topic,
    replicated_topic,
    restore_followers,
    stranding_topic,
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
    appended = kp.append([ProducerRecord(key.topic, b"r", partition=0)])
    # validate=False: DescribeTopics may be routed to a frozen broker (the "controller" it was told).
    op = kp.submit(DelayedProduce(kp.feed, appended, delay_ms=1000), validate=False)
    assert op.wait(WAIT_S)
    assert op.outcome is Outcome.EXPIRED and op.statuses == {key: ErrorCode.REQUEST_TIMED_OUT}


def _record_at(kp: KafkaPurgatory, key: TopicPartitionKey, offset: int) -> FetchedRecord:
    """The record the partition's leader now serves at ``offset``. Right after a leader change a
    read may come back empty (the reader still asks the old leader, and it does not hold its
    fetches: ``fetch.wait.max.ms`` 0), so wait (bounded) until the new leader serves it."""
    found: list[FetchedRecord] = []

    def served() -> bool:
        found[:] = kp.reader.read(key, offset, offset + 1, max_bytes=1 << 20)
        return bool(found)

    wait_until(served, f"the leader serves offset {offset} of {key.label}")
    return found[0]


def _warmed_and_watched(kp: KafkaPurgatory, key: TopicPartitionKey) -> int:
    """The leader-change tests' start: the producer is warm (it knows the leader and holds a
    connection to it), the partition stays watched throughout (so the feed keeps its facts fresh),
    and the feed holds the partition's leader epoch, which is returned."""
    warm = kp.produce([ProducerRecord(key.topic, b"warm-up", partition=0)], delay_ms=30_000)
    assert warm.wait(WAIT_S) and warm.succeeded, warm.statuses
    kp.submit(DelayedDeleteRecords(kp.feed, {key: 10**9}, delay_ms=120_000), validate=False)
    wait_until(
        lambda: getattr(kp.feed.partition(key), "leader_epoch", None) is not None,
        "the feed holds the partition's leader epoch",
    )
    epoch = getattr(kp.feed.partition(key), "leader_epoch", None)
    assert isinstance(epoch, int)
    return epoch


def test_produce_is_not_answered_replicated_when_a_leader_change_discarded_the_record(
    kafka_cluster3: LocalKafkaCluster,
) -> None:
    """The acks=1 hole: the leader dies before any follower fetched the record.

    Replicas [2, 3, 1]: node 2 leads. Both followers are frozen, node 2 appends a filler and the
    record (no follower can hold the record: see :class:`StrandedRecord`), node 2 is killed and
    the followers resume before they miss a heartbeat: the controller elects node 3 (in the
    ISR, first in the replica order), which never had the record. Records produced afterwards
    take its offset and the new leader's high watermark passes it. Before the leader-epoch fence
    the first produce then answered NONE (replicated) for a record no broker has.
    """
    cluster = kafka_cluster3
    settings, key = stranding_topic(cluster, "lost")
    kp = KafkaPurgatory.connect(settings, name="leader-change")
    stranded: StrandedRecord | None = None
    try:
        old_epoch = _warmed_and_watched(kp, key)
        stranded = StrandedRecord(cluster, settings, key)
        stranded.freeze_followers()
        try:
            stranded.append_filler()
            lost = kp.produce([ProducerRecord(key.topic, b"lost", partition=0)], delay_ms=60_000)
            offset = lost.appended[key]
            stranded.assert_stranded(offset)
            assert not lost.is_completed(), "the leader has the record, no follower has: not replicated"
        finally:
            stranded.kill_leader_and_resume()
        wait_until(
            lambda: (
                (facts := kp.feed.partition(key)) is not None
                and facts.leader in stranded.followers
                and facts.leader_epoch not in (None, old_epoch)
            ),
            "the feed saw a follower that lacks the record lead the partition in a new epoch",
            60.0,
        )
        after = kp.produce([ProducerRecord(key.topic, f"after-{i}".encode(), partition=0) for i in range(3)])
        assert after.wait(WAIT_S) and after.succeeded, after.statuses
        assert after.appended[key] >= offset, "the new leader reused the lost record's offset"
        assert lost.wait(WAIT_S)
        at_offset = _record_at(kp, key, offset)
        assert at_offset.value != b"lost", "no follower had the record: the leader change discarded it"
        assert kp.feed.partition(key).leader_epoch != old_epoch  # type: ignore[union-attr]
        assert lost.statuses == {key: ErrorCode.NOT_LEADER_OR_FOLLOWER}, (
            f"record at offset {offset} was discarded by the leader change, yet: {lost.statuses}"
        )
        assert not lost.succeeded
    finally:
        kp.close()
        if stranded is not None:
            stranded.close()
        else:
            wait_isr(settings, key, 3)


@pytest.mark.parametrize("feed_mode", ["push", "poll"])
def test_a_record_a_zombie_leader_appended_after_the_feed_saw_its_successor_is_not_answered_replicated(
    kafka_cluster3: LocalKafkaCluster, feed_mode: str
) -> None:
    """The leader epoch noted before an append can be *newer* than the epoch that appended.

    Replicas [2, 3, 1]: node 2 leads. Node 2 hangs (SIGSTOP, a long GC pause) past the session
    timeout: the controller fences it and node 3 leads in a new epoch, which the feed sees. The
    producer was told nothing (its connection to node 2 is merely idle): it still sends to node 2.
    Node 2 resumes while the controller (node 1) is frozen, so it cannot learn it lost the
    partition: a zombie, it appends the record (acks=1) in its old epoch. The fence noted the new
    epoch before the append, the facts keep showing that epoch, and once records produced to node
    3 take the offset, its high watermark passes it: the epoch rule alone answered NONE, for a
    record node 2 truncates as soon as it hears of node 3. The record read back at the offset
    is another one: NOT_LEADER_OR_FOLLOWER.
    """
    cluster = kafka_cluster3
    base, key = stranding_topic(cluster, "zombie")
    settings = base.model_copy(update={"feed_mode": feed_mode})
    kp = KafkaPurgatory.connect(settings, name=f"zombie-{feed_mode}")
    zombie, successor, controller = STRANDING_REPLICAS[0], STRANDING_REPLICAS[1], 1
    try:
        old_epoch = _warmed_and_watched(kp, key)
        cluster.pause_broker(zombie)
        try:
            wait_until(
                lambda: (
                    (facts := kp.feed.partition(key)) is not None
                    and facts.error is None
                    and facts.leader == successor
                    and facts.leader_epoch not in (None, old_epoch)
                ),
                "the controller fenced the hung leader and the feed saw its successor's epoch",
                30.0,
            )
            new_epoch = kp.feed.partition(key).leader_epoch  # type: ignore[union-attr]
            cluster.pause_broker(controller)  # no metadata reaches node 2 while it is resumed
            try:
                cluster.resume_broker(zombie)
                appended = kp.append([ProducerRecord(key.topic, b"zombie", partition=0)], timeout_s=WAIT_S)
            finally:
                cluster.resume_broker(controller)
        finally:
            cluster.resume_broker(zombie)
        offset = appended.offsets[key]
        assert appended.leader_epochs[key] == new_epoch, "the fence noted the successor's epoch"
        op = kp.submit(DelayedProduce(kp.feed, appended, delay_ms=60_000), validate=False)

        # Records produced to node 3 itself (bootstrapped there: node 2 may still claim the
        # partition in its metadata answers) take the offset; acks=all: its high watermark passes it.
        successor_address = f"127.0.0.1:{cluster.node(successor).spec.broker_port}"
        producer = Producer({"bootstrap.servers": successor_address, "acks": "all", "log_level": 0})
        delivered: list[tuple[Any, Any]] = []
        for _ in range(3):
            producer.produce(
                key.topic, b"after", partition=0, on_delivery=lambda e, m: delivered.append((e, m))
            )
        assert producer.flush(WAIT_S) == 0, "node 3 did not take the records in time"
        assert all(e is None for e, _ in delivered), delivered
        assert max(m.offset() for _, m in delivered) >= offset, (
            "records produced to node 3 reached the offset"
        )
        assert op.wait(WAIT_S)
        at_offset = _record_at(kp, key, offset)
        assert at_offset.value != b"zombie", "node 2 appended it after node 3 took over: it is discarded"
        assert op.statuses == {key: ErrorCode.NOT_LEADER_OR_FOLLOWER}, (
            f"record at offset {offset} was appended by a deposed leader and discarded, yet: {op.statuses}"
        )
    finally:
        kp.close()
        for node in (controller, zombie):
            cluster.resume_broker(node)
        wait_isr(base, key, 3)


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


def _high_watermark_once_answered(view: ClusterView, key: TopicPartitionKey) -> int:
    """The high watermark, once the leader answers (it may still be loading after an election)."""
    answer: list[int] = []

    def answered() -> bool:
        try:
            answer.append(view.high_watermarks([key])[key])
        except KafkaUnavailableError:
            return False
        return True

    wait_until(answered, f"the leader of {key.label} answers ListOffsets")
    return answer[-1]


BOUNCED_RECORDS = 100_000  # one request: about a second of appends here
KILLED, FROZEN = "killed and restarted", "frozen past the produce request's timeout"
# Frozen for less than broker.session.timeout.ms (3 s in the launcher): the node keeps leading in
# the same epoch, so the leader-epoch fence cannot tell. The produce in flight times out
# (librdkafka's socket.timeout.ms, below: its request.timeout.ms is the broker's ack timeout) and
# the client drops the connection while the frozen broker still holds the request in its socket
# buffer — and appends it when it resumes. A producer that retried has appended it twice by then.
FREEZE_S = 2.0
SOCKET_TIMEOUT_MS = "300"
# Small produce requests: one sent to the frozen broker fits its socket buffer whole (a 1 MB one
# would arrive cut, and a request cut short is never appended, however long the freeze).
PRODUCE_BATCH_BYTES = "16384"


@pytest.mark.parametrize("fault", [KILLED, FROZEN])
def test_one_request_keeps_its_order_and_never_silently_duplicates_when_the_leader_is_bounced(
    kafka_cluster3: LocalKafkaCluster, fault: str
) -> None:
    """Mid-request, the leader is killed and restarted (a new leader, a new epoch) or frozen past
    the produce's timeout and resumed (the same leader and epoch). A producer that retried a batch
    whose answer was lost appended it twice — the frozen leader appends the first copy on resume —
    and the fence saw no leader change: 200 for a log holding duplicates. Now nothing is resent:
    the log holds each record of the request at most once, in order, and the answer says which
    were acknowledged and which may or may not be there."""
    cluster = kafka_cluster3
    settings = KafkaSettings(
        bootstrap_servers=cluster.bootstrap_servers,
        request_timeout_ms=2000,
        client_config=(
            {"socket.timeout.ms": SOCKET_TIMEOUT_MS, "batch.size": PRODUCE_BATCH_BYTES}
            if fault == FROZEN
            else {}
        ),
    )
    topic = create_topic(
        cluster.bootstrap_servers,
        f"bounce-{uuid.uuid4().hex[:8]}",
        replica_assignment=[[2, 3, 1]],
        config={"min.insync.replicas": "2"},
    )
    key = TopicPartitionKey(topic, 0)
    wait_isr(settings, key, 3)
    kp = KafkaPurgatory.connect(settings, name="bounce")
    view = ClusterView(settings)
    try:
        warm = kp.produce([ProducerRecord(topic, b"warm-up", partition=0)], delay_ms=30_000)
        assert warm.wait(WAIT_S) and warm.succeeded, warm.statuses
        start = warm.appended[key] + 1
        assert _high_watermark_once_answered(view, key) == start  # the view is connected: answers fast
        epoch_before = view.leader_epochs([key])[key]
        records = [ProducerRecord(topic, b"%06d" % i, partition=0) for i in range(BOUNCED_RECORDS)]
        op: DelayedProduce | None = None
        error: AppendOutcomeUnknownError | None = None
        with ThreadPoolExecutor(1) as pool:
            appending = pool.submit(kp.produce, records, delay_ms=30_000, timeout_s=60.0)
            # Mid-request: the leader has some of the records (no event to wait on); frozen at
            # once, it can take no more, so the rest of the request meets the fault.
            wait_until(
                lambda: appending.done() or _high_watermark_once_answered(view, key) > start + 1000,
                "the leader appended part of the request",
            )
            cluster.pause_broker(2)
            assert not appending.done(), "the request finished before the fault: raise BOUNCED_RECORDS"
            if fault == KILLED:
                cluster.kill_broker(2)
                cluster.start_broker(2)
            else:
                time.sleep(FREEZE_S)  # the fault's length: no event to wait on, by design
                cluster.resume_broker(2)
            try:
                op = appending.result(timeout=90)
            except AppendOutcomeUnknownError as exc:
                error = exc
        if op is not None:
            assert op.wait(40)
        wait_isr(settings, key, 3)
        end = _high_watermark_once_answered(view, key)
        if fault == FROZEN:
            assert view.leader_epochs([key])[key] == epoch_before, "the frozen node lost its leadership"
        values = [r.value for r in kp.reader.read(key, start, end, max_bytes=1 << 30, timeout_s=60)]
        seqs = [int(v) for v in values if v is not None]
        first_seen = list(dict.fromkeys(seqs))
        duplicated = len(seqs) - len(first_seen)
        lost = BOUNCED_RECORDS - len(first_seen)
        answer = f"{error!r}" if error is not None else f"statuses {op.statuses if op else None}"
        print(f"{fault}: {duplicated} duplicated, {lost} not in the log; answer: {answer}")
        assert first_seen == sorted(first_seen), "the request's records were reordered"
        assert duplicated == 0, f"{duplicated} record(s) appended twice (a resent batch); answer: {answer}"
        if error is not None:
            # The answer's counts bound what the log holds: the refused records are not there,
            # the unknown ones may be, and the acknowledged ones are unless a leader change
            # discarded them (acks=1: the killed leader's last records never reached node 3).
            assert error.acknowledged + error.refused + error.unknown == BOUNCED_RECORDS, answer
            assert len(first_seen) <= error.acknowledged + error.unknown, answer
            if fault == FROZEN:
                assert error.acknowledged <= len(first_seen), answer
                # The first unknown outcome withdrew everything queued behind it: the log holds
                # the records sent before the freeze (and perhaps the frozen batch), nothing
                # sent after it on a new connection, so a prefix of the request. Without the
                # withdrawal a later batch could land before the frozen one (seen in CI).
                assert first_seen == list(range(len(first_seen))), "not a prefix of the request"
                assert error.refused > 0, f"nothing was withdrawn after the unknown outcome: {answer}"
            assert error.unknown > 0 or error.refused > 0, answer
        else:
            assert op is not None
            if lost:
                assert not op.succeeded, f"{lost} record(s) not in the log, yet: {op.statuses}"
            else:
                assert op.succeeded or op.statuses == {key: ErrorCode.NOT_LEADER_OR_FOLLOWER}, op.statuses
    finally:
        view.close()
        kp.close()
        cluster.resume_broker(2)
        if not cluster.node(2).is_running():
            cluster.start_broker(2)
        wait_isr(settings, key, 3)
