"""Kafka fault scenarios: a broker killed or paused while operations wait on it; the journal's
Kafka sink unreachable. Each runs against a :class:`LocalKafkaCluster` the caller started (and
stops, by PID); each returns a :class:`~._faults.FaultResult`.

Needs the ``kafka`` extra: ``purgatory bench reliability`` imports this module only to run them.

What every scenario checks: the purgatory keeps serving keys unrelated to the fault (a local
operation completes at once, within ``SERVE_BUDGET_S``), every operation the fault touched
finishes exactly once with a clear status (expired, with a ``KafkaUnavailableError`` saying
Kafka was unreachable, ``REQUEST_TIMED_OUT`` per partition where the operation has statuses),
and once the broker is back the change feed, the producer and the journal sink recover.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
import structlog.testing
from purgatory.adapters import kafka
from purgatory.adapters.kafka import KafkaOperation, KafkaPurgatory, LocalKafkaCluster, journal_sink

from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome

from ._faults import FaultResult

__all__ = ["broker_fault", "create_topic", "journal_sink_unreachable"]

NODE = 1  # the single broker (also the controller) of the scenarios' cluster
REQUEST_TIMEOUT_MS = 1000  # the view gives up on a dead or frozen broker after this long
OP_DELAY_MS = 7000  # expire well after the view (1 s request timeout) has reported the outage
WAIT_S = 30.0  # bound on any single wait for Kafka (start, recover, deliver)
SERVE_BUDGET_S = 0.5  # a local operation must be served this fast while Kafka is down
WAITING_PER_KIND = 3  # operations of each Kafka kind waiting when the fault hits
JOURNAL_OPS = 300  # operations journaled in each phase of the sink scenario


def _wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` (cluster state gives no client-side event) until true or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def create_topic(
    bootstrap: str,
    partitions: int = 1,
    *,
    replication: int = 1,
    config: dict[str, str] | None = None,
    prefix: str = "reliability",
) -> str:
    """A new topic (a unique name from ``prefix``), returned once every partition has a leader."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    new = NewTopic(name, partitions, replication, config=config or {})
    for future in admin.create_topics([new], request_timeout=WAIT_S).values():
        future.result(timeout=WAIT_S)

    def has_leaders() -> bool:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        return (
            topic is not None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        )

    if not _wait_until(has_leaders, WAIT_S):
        raise TimeoutError(f"topic {name} has no leader after {WAIT_S} s")
    return name


class _Local(DelayedOperation):
    """An operation on a key unrelated to Kafka: the purgatory's other business."""

    def __init__(self) -> None:
        super().__init__(60_000)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> None:
        pass


def _serves_local_keys(purgatory: DelayedOperationPurgatory[Any], result: FaultResult, when: str) -> None:
    local, key = _Local(), f"local-{uuid.uuid4().hex[:6]}"
    purgatory.try_complete_else_watch(local, [key])
    local.ready = True
    began = time.monotonic()
    purgatory.check_and_complete(key)
    elapsed = time.monotonic() - began
    result.check(
        local.outcome is Outcome.COMPLETED and elapsed < SERVE_BUDGET_S,
        f"{when}: a local operation took {elapsed:.3f} s or did not complete ({local.outcome})",
    )


def _failing_response(_op: KafkaOperation) -> None:
    raise RuntimeError("on_response failed on purpose")


def _submit_waiting(
    kp: KafkaPurgatory, topic: str, next_offset: int, with_groups: bool
) -> list[KafkaOperation]:
    """Operations of every Kafka kind that cannot complete before their timeout."""
    DelayedConsumerCommit, DelayedFetch = kafka.DelayedConsumerCommit, kafka.DelayedFetch
    DelayedReplication, DelayedTopicReady = kafka.DelayedReplication, kafka.DelayedTopicReady
    key = kafka.TopicPartitionKey(topic, 0)
    ops: list[KafkaOperation] = []
    for i in range(WAITING_PER_KIND):
        # One of each kind answers through a raising user callback: it must finish all the same.
        response = _failing_response if i == 0 else None
        ops.append(
            DelayedReplication(kp.feed, {key: next_offset + 100}, delay_ms=OP_DELAY_MS, on_response=response)
        )
        ops.append(
            DelayedFetch(
                kp.feed,
                kp.reader,
                {key: next_offset},
                min_records=1000,
                max_wait_ms=OP_DELAY_MS,
                on_response=response,
            )
        )
        ops.append(
            DelayedTopicReady(
                kp.feed, f"never-{uuid.uuid4().hex[:8]}", delay_ms=OP_DELAY_MS, on_response=response
            )
        )
        if with_groups:
            ops.append(
                DelayedConsumerCommit(
                    kp.feed,
                    f"group-{uuid.uuid4().hex[:6]}",
                    {key: 1_000},
                    delay_ms=OP_DELAY_MS,
                    on_response=response,
                )
            )
    for op in ops:
        kp.submit(op, validate=False)
    return ops


# What an operation that waited through an outage may answer per partition: not in time, or
# Kafka unreachable (a commit wait whose group could not be read says so).
_OUTAGE_STATUSES = frozenset({kafka.ErrorCode.REQUEST_TIMED_OUT, kafka.ErrorCode.KAFKA_UNAVAILABLE})


def _clear_status(op: KafkaOperation) -> str | None:
    """None if ``op`` ended clearly for an outage, else what is unclear about it."""
    if not op.done.is_set() or op.outcome is not Outcome.EXPIRED:
        return f"{type(op).__name__} ended {op.outcome}, expected EXPIRED"
    if not isinstance(op.error, kafka.KafkaUnavailableError) or not str(op.error):
        return f"{type(op).__name__} expired without saying Kafka was unreachable: {op.error!r}"
    statuses = getattr(op, "statuses", None)
    # A fetch's per-partition statuses say what it read (NONE: nothing wrong with the offsets).
    if (
        statuses
        and type(op).__name__ != "DelayedFetch"
        and any(status not in _OUTAGE_STATUSES for status in statuses.values())
    ):
        return f"{type(op).__name__} statuses {statuses}, expected REQUEST_TIMED_OUT or KAFKA_UNAVAILABLE"
    return None


def broker_fault(cluster: LocalKafkaCluster, mode: str, *, with_groups: bool = True) -> FaultResult:
    """The broker is killed (SIGKILL, ``mode="kill"``) or frozen (SIGSTOP, ``mode="pause"``)
    while produce, fetch, topic-ready and (``with_groups``) consumer-commit operations wait on
    it; then it comes back.

    The cluster view reads committed offsets with a non-joining consumer's OffsetFetch, not with
    the admin ListConsumerGroupOffsets request, which aborted the whole process when it timed
    out on a frozen connection (librdkafka #4605, "rd_kafka_enq_once_del_source_return:
    Assertion `eonce->refcnt > 0' failed"). ``with_groups=False`` leaves the group kind out.
    """
    if mode not in ("kill", "pause"):
        raise ValueError(f"mode must be 'kill' or 'pause', got {mode!r}")
    from purgatory.adapters.kafka.settings import KafkaSettings

    ProducerRecord, TopicPartitionKey = kafka.ProducerRecord, kafka.TopicPartitionKey

    result = FaultResult(
        f"broker {'killed (SIGKILL)' if mode == 'kill' else 'paused (SIGSTOP)'} while operations wait"
    )
    started = time.perf_counter()
    settings = KafkaSettings(
        bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    topic = create_topic(cluster.bootstrap_servers)
    key = TopicPartitionKey(topic, 0)
    faulted = False
    with structlog.testing.capture_logs() as logs:
        kp = kafka.KafkaPurgatory.connect(settings, name=f"fault-{mode}")
        try:
            first = kp.produce([ProducerRecord(topic, b"before", partition=0)], delay_ms=10_000)
            result.check(first.wait(WAIT_S) and first.outcome is Outcome.COMPLETED, "healthy produce failed")
            ops = _submit_waiting(kp, topic, first.appended[key] + 1, with_groups)
            result.affected = len(ops)
            pid = cluster.node(NODE).pid
            if mode == "kill":
                cluster.kill_broker(NODE)
                result.check(
                    pid is not None and not cluster.node(NODE).is_running(),
                    f"broker pid {pid} survived SIGKILL",
                )
            else:
                cluster.pause_broker(NODE)
            faulted = True
            _serves_local_keys(kp.purgatory, result, "broker down")
            result.check(
                _wait_until(lambda: kp.feed.unavailable is not None, WAIT_S), "the feed never noticed"
            )
            _serves_local_keys(kp.purgatory, result, "feed reporting the outage")
            finished = all(op.wait(max(0.0, OP_DELAY_MS / 1000 + WAIT_S)) for op in ops)
            result.check(finished, "an operation waiting on the broker never finished")
            unclear = [problem for op in ops if (problem := _clear_status(op)) is not None]
            result.check(not unclear, f"unclear statuses: {unclear[:3]}")
            result.outcomes = dict(
                collections.Counter(
                    f"{type(op).__name__}: {op.outcome.value if op.outcome else '?'}" for op in ops
                )
            )
            result.check(kp.feed.is_alive(), "the change feed thread died")
            for purgatory in kp.purgatories.values():  # one per kind of operation
                reaper = purgatory._reaper
                result.check(reaper is not None and reaper.is_alive(), f"{purgatory.name}: reaper died")

            # Recovery: the broker returns, the feed reconnects, new operations complete.
            # Something must stay watched for the feed to keep probing (it polls watched keys only).
            probe = kp.submit(
                kafka.DelayedReplication(kp.feed, {key: 1_000_000}, delay_ms=120_000), validate=False
            )
            if mode == "kill":
                cluster.start_broker(NODE, timeout_s=WAIT_S)
            else:
                cluster.resume_broker(NODE)
            faulted = False
            result.check(_wait_until(lambda: kp.feed.unavailable is None, WAIT_S), "the feed did not recover")
            again = kp.produce([ProducerRecord(topic, b"after", partition=0)], delay_ms=int(WAIT_S * 1000))
            result.check(
                again.wait(WAIT_S) and again.outcome is Outcome.COMPLETED, "produce after recovery failed"
            )
            fetch = kp.fetch({key: again.appended[key]}, min_records=1, max_wait_ms=10_000)
            result.check(
                fetch.wait(WAIT_S) and fetch.outcome is Outcome.COMPLETED and len(fetch.records[key]) == 1,
                "fetch after recovery failed",
            )
            probe.force_complete()
        finally:
            if faulted and mode == "pause":
                cluster.resume_broker(NODE)  # never leave a frozen JVM behind
            elif faulted:
                cluster.start_broker(NODE, timeout_s=WAIT_S)
            kp.close()
        result.user_code_errors = sum(p.stats.as_dict()["user_code_errors"] for p in kp.purgatories.values())
        kinds = 4 if with_groups else 3
        result.check(result.user_code_errors >= kinds, "the raising on_response callbacks were not counted")
    result.logged_errors = sum(1 for log in logs if log.get("log_level") in ("error", "warning", "exception"))
    result.check(any(log["event"] == "kafka_feed_unavailable" for log in logs), "the outage was not logged")
    result.seconds = time.perf_counter() - started
    return result


def journal_sink_unreachable(cluster: LocalKafkaCluster) -> FaultResult:
    """The journal's Kafka sink loses its broker (SIGKILL) while the purgatory keeps working.

    The purgatory must not notice (the journal never blocks a caller); events produced during
    the outage wait in librdkafka's queue and are delivered once the broker is back: afterwards
    the topic holds every operation's created and finish events, none lost.
    """
    from confluent_kafka import Consumer

    from purgatory.journal import Journal, JournalEvent

    KafkaJournalSink, ensure_journal_topic = journal_sink.KafkaJournalSink, journal_sink.ensure_journal_topic

    result = FaultResult("journal's Kafka sink unreachable")
    started = time.perf_counter()
    # log_level 0: librdkafka would print every refused reconnect of the outage to stderr.
    config = {"bootstrap.servers": cluster.bootstrap_servers, "log_level": "0"}
    topic = f"journal-{uuid.uuid4().hex[:8]}"
    ensure_journal_topic(config, topic, partitions=1, replication_factor=1)
    sink = KafkaJournalSink(config, topic)
    journal = Journal([sink], flush_interval_s=0.05, name="fault")
    purgatory: DelayedOperationPurgatory[_Local] = DelayedOperationPurgatory("journaled")
    journal.attach(purgatory)
    faulted = False
    finishes: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()

    class Journaled(_Local):
        def on_complete(self) -> None:
            with lock:
                finishes[id(self)] += 1

    def phase(label: str) -> list[Journaled]:
        ops = [Journaled() for _ in range(JOURNAL_OPS)]
        slowest = 0.0
        for i, op in enumerate(ops):
            began = time.monotonic()
            purgatory.try_complete_else_watch(op, [f"{label}-{i % 10}"])
            if i % 2 == 0:
                op.ready = True
                purgatory.check_and_complete(f"{label}-{i % 10}")
            else:
                op.force_complete()
            slowest = max(slowest, time.monotonic() - began)
        result.check(slowest < SERVE_BUDGET_S, f"{label}: a journaled operation took {slowest:.3f} s")
        return ops

    with structlog.testing.capture_logs() as logs:
        try:
            ops = phase("healthy")
            result.check(journal.flush(WAIT_S), "the journal did not flush while Kafka was up")
            cluster.kill_broker(NODE)
            faulted = True
            ops += phase("outage")  # the purgatory works on; events queue in librdkafka
            result.affected = JOURNAL_OPS
            result.check(purgatory.stats.as_dict()["completed"] == 2 * JOURNAL_OPS, "operations were lost")
            cluster.start_broker(NODE, timeout_s=WAIT_S)
            faulted = False
            result.check(journal.flush(WAIT_S), "the journal did not catch up after the broker came back")
        finally:
            if faulted:
                cluster.start_broker(NODE, timeout_s=WAIT_S)
            purgatory.shutdown()
            journal.close()
    stats = journal.stats()
    expected_events = 2 * 2 * JOURNAL_OPS  # created + completed, two phases
    result.check(stats.dropped == 0 and stats.failed == 0, f"journal dropped or failed events: {stats}")
    result.check(sink.delivery_errors == 0, f"{sink.delivery_errors} journal records were not delivered")
    result.check(
        sink.delivered == expected_events, f"{sink.delivered} of {expected_events} records delivered"
    )
    result.check(
        all(n == 1 for n in finishes.values()) and len(finishes) == 2 * JOURNAL_OPS, "finishes wrong"
    )

    # Read the topic back: every operation's two events, each once.
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"reliability-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": "false",
        }
    )
    seen: set[str] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while len(seen) < expected_events and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                value = message.value()
                if message.error() is None and value is not None:
                    seen.add(JournalEvent.from_json(value).event_id)
    finally:
        consumer.close()
    result.check(
        len(seen) == expected_events, f"{len(seen)} of {expected_events} distinct events on the topic"
    )
    result.outcomes = {
        "completed": purgatory.stats.as_dict()["completed"],
        "journal events on the topic": len(seen),
    }
    result.logged_errors = sum(1 for log in logs if log.get("log_level") in ("error", "warning", "exception"))
    result.seconds = time.perf_counter() - started
    return result
