"""The journal's Kafka sink fails at attach when its topic is missing, or creates it when told to."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from purgatory.adapters.kafka.journal_sink import JournalTopicError, KafkaJournalSink

from purgatory import DelayedOperationPurgatory
from purgatory.journal import Journal
from purgatory.testing import MockTimer
from tests.core.ops import MockDelayedOperation

pytestmark = pytest.mark.kafka


def _purgatory() -> tuple[DelayedOperationPurgatory[Any], MockTimer]:
    timer = MockTimer()
    return DelayedOperationPurgatory("journaled", timer=timer, reaper_enabled=False), timer


def test_a_missing_journal_topic_fails_the_attach(kafka_bootstrap: str) -> None:
    topic = f"journal-missing-{uuid.uuid4().hex[:8]}"
    journal = Journal([KafkaJournalSink({"bootstrap.servers": kafka_bootstrap}, topic)])
    purgatory, _ = _purgatory()
    try:
        with pytest.raises(JournalTopicError, match=topic):
            journal.attach(purgatory)
    finally:
        purgatory.shutdown()
        journal.close()


def test_create_topic_makes_the_journal_topic_and_counts_acknowledged_events(kafka_bootstrap: str) -> None:
    topic = f"journal-created-{uuid.uuid4().hex[:8]}"
    sink = KafkaJournalSink({"bootstrap.servers": kafka_bootstrap}, topic, create_topic=True)
    journal = Journal([sink], flush_interval_s=0.01)
    purgatory, timer = _purgatory()
    try:
        journal.attach(purgatory)
        for index in range(4):
            purgatory.try_complete_else_watch(MockDelayedOperation(10), [index])
        timer.advance_clock(10)
    finally:
        purgatory.shutdown()
        journal.close()
    stats = journal.stats()
    assert stats.failed == 0 and stats.written == 8 == sink.delivered, "4 created + 4 expired, acknowledged"


async def test_connect_with_a_journal_topic_missing_fails_on_entering(kafka_settings: object) -> None:
    from purgatory.adapters.kafka import KafkaPurgatory
    from purgatory.adapters.kafka.settings import KafkaSettings

    from purgatory.settings import JournalSettings, Settings

    assert isinstance(kafka_settings, KafkaSettings)
    topic = f"journal-absent-{uuid.uuid4().hex[:8]}"
    journal = JournalSettings(enabled=True, sinks=("kafka",), topic=topic)
    kp = KafkaPurgatory.connect(Settings(kafka=kafka_settings, journal=journal))
    with pytest.raises(JournalTopicError, match=topic):
        async with kp:
            pass
    assert not kp.feed.is_alive(), "the failed start closed what connect() started"
