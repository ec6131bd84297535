"""KafkaJournalSink's contract without a broker: a fake producer records what the sink asks for.

(The sink against a real Kafka is exercised in tests/spark/test_kafka.py.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from purgatory.adapters.kafka.journal_sink import JournalTopicError, KafkaJournalSink, build_journal
from structlog.testing import capture_logs

from purgatory import DelayedOperationPurgatory
from purgatory.journal import FileJournalSink, Journal
from purgatory.journal.synthetic import synthetic_events
from purgatory.settings import load_settings
from purgatory.testing import MockTimer


class FakeMessage:
    def __init__(self, key: str) -> None:
        self._key = key

    def key(self) -> str:
        return self._key


class FakeProducer:
    """Accepts ``room`` records, then raises BufferError until ``poll`` delivers the queued ones."""

    def __init__(self, config: dict[str, Any], room: int = 1_000_000, fail: bool = False) -> None:
        self.config = config
        self.room = room
        self.fail = fail
        self.produced: list[tuple[str, str, str]] = []
        self.pending: list[tuple[Callable[..., None], str]] = []
        self.unacknowledged_after_flush = 0

    def produce(self, topic: str, key: str, value: str, on_delivery: Callable[..., None]) -> None:
        if len(self.pending) >= self.room:
            raise BufferError("Local: Queue full")
        self.produced.append((topic, key, value))
        self.pending.append((on_delivery, key))

    def poll(self, timeout: float) -> int:
        delivered, self.pending = self.pending, []
        for callback, key in delivered:
            error = KafkaError(KafkaError._MSG_TIMED_OUT) if self.fail else None
            callback(error, FakeMessage(key))
        return len(delivered)

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return self.unacknowledged_after_flush


class FakeAdmin:
    """Answers list_topics with the topics it holds; create_topics is not faked (real Kafka tests)."""

    def __init__(self, topics: set[str]) -> None:
        self.topics = topics

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={t: SimpleNamespace(error=None) for t in self.topics})


def _sink(
    topics: frozenset[str] = frozenset({"journal"}),
    clock: Callable[[], float] = time.monotonic,
    **producer_args: Any,
) -> tuple[KafkaJournalSink, list[FakeProducer]]:
    made: list[FakeProducer] = []

    def factory(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config, **producer_args))
        return made[-1]

    sink = KafkaJournalSink(
        {"bootstrap.servers": "x:1"},
        "journal",
        producer_factory=factory,  # type: ignore[arg-type]
        admin_factory=lambda _config: FakeAdmin(set(topics)),  # type: ignore[arg-type,return-value]
        clock=clock,
    )
    return sink, made


def test_records_are_keyed_by_operation_id_through_an_idempotent_acks_all_producer() -> None:
    sink, made = _sink()
    assert made == [], "no producer (no network) before the first write"
    events = list(synthetic_events(5))
    sink.write(events)
    sink.flush()
    (producer,) = made
    assert producer.config["enable.idempotence"] == "true" and producer.config["acks"] == "all"
    assert [(t, k) for t, k, _ in producer.produced] == [("journal", e.op_id) for e in events]
    assert [v for _, _, v in producer.produced] == [e.to_json() for e in events]
    assert sink.delivered == 10 and sink.delivery_errors == 0


def test_a_full_local_queue_is_served_then_retried_not_dropped() -> None:
    sink, made = _sink(room=3)
    events = list(synthetic_events(5))
    sink.write(events)
    assert len(made[0].produced) == 10, "every event produced once the queue drained"
    sink.close()
    assert sink.delivered == 10


def test_delivery_failures_are_counted() -> None:
    sink, _ = _sink(fail=True)
    sink.write(list(synthetic_events(2)))
    sink.flush()
    assert sink.delivery_errors == 4 and sink.delivered == 0


def test_flush_names_the_events_not_acknowledged() -> None:
    sink, made = _sink()
    sink.write(list(synthetic_events(1)))
    made[0].unacknowledged_after_flush = 7
    with pytest.raises(KafkaException, match="7 journal events to 'journal' not acknowledged"):
        sink.flush()


@pytest.mark.parametrize(("name", "value"), [("acks", "1"), ("enable.idempotence", "false")])
def test_weakened_guarantees_are_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"{name} = '{value}'"):
        KafkaJournalSink({"bootstrap.servers": "x:1", name: value}, "journal")


def test_build_journal_follows_the_settings(tmp_path: Path) -> None:
    assert build_journal(load_settings(journal={"enabled": False})) is None
    settings = load_settings(journal={"enabled": True, "sinks": ["file"], "directory": str(tmp_path)})
    journal = build_journal(settings)
    assert journal is not None
    try:
        assert [type(s) for s in journal._sinks] == [FileJournalSink]
    finally:
        journal.close()
    with pytest.raises(ValueError, match="bootstrap"):
        build_journal(
            load_settings(journal={"enabled": True, "sinks": ["kafka"]}, kafka={"bootstrap_servers": None})
        )


# -- loud failures, honest counts (issue 13) ---------------------------------------------------


def test_attaching_a_journal_whose_topic_is_missing_fails_at_once() -> None:
    sink, made = _sink(topics=frozenset({"other"}))
    journal = Journal([sink])
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory(
        "p", timer=MockTimer(), reaper_enabled=False
    )
    try:
        with pytest.raises(JournalTopicError, match=r"journal topic 'journal' does not exist.*create_topic"):
            journal.attach(purgatory)
        assert made == [], "nothing was produced to a topic that is not there"
    finally:
        purgatory.shutdown()
        journal.close()


def _journal_events(sink: KafkaJournalSink, operations: int) -> Journal:
    from tests.core.ops import MockDelayedOperation

    timer = MockTimer()
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory(
        "p", timer=timer, reaper_enabled=False
    )
    journal = Journal([sink]).attach(purgatory)
    for i in range(operations):
        purgatory.try_complete_else_watch(MockDelayedOperation(10), [i])
    timer.advance_clock(10)
    purgatory.shutdown()
    assert journal.flush()
    return journal


def test_journal_counts_kafka_events_written_only_once_acknowledged() -> None:
    sink, _ = _sink(fail=True)
    journal = _journal_events(sink, 5)
    try:
        stats = journal.stats()
        assert stats.written == 0, "no event reached Kafka: none counts as written"
        assert stats.failed == 10 and stats.sinks[0].failed == 10
    finally:
        journal.close()


def test_delivery_errors_are_logged_once_per_interval_with_a_count() -> None:
    now = [0.0]
    sink, _ = _sink(fail=True, clock=lambda: now[0])
    with capture_logs() as logs:
        sink.write(list(synthetic_events(50)))  # 100 events, all failing
        sink.flush()
        now[0] += 11.0  # past DELIVERY_ERROR_LOG_INTERVAL_S
        sink.write(list(synthetic_events(1)))
        sink.flush()
    failures = [log for log in logs if log["event"] == "journal_delivery_failed"]
    # The first failure is logged; the next 99 only counted, and reported with the next line.
    assert [log["failed_since_last_report"] for log in failures] == [0, 99]
    assert sink.delivery_errors == 102
