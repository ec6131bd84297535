"""Answers per status and feed health for a bare KafkaPurgatory (issue 28, item 6), without Kafka.

The operations are finished by hand (a refused record, a refusal before any wait); the counts
and gauges are read from a :class:`KafkaCollector` as a scrape would.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry
from purgatory.adapters.kafka import DelayedProduce, DelayedTopicReady, ErrorCode, ProducerRecord
from purgatory.adapters.kafka._metrics import ANSWERS, AnswerCounts, KafkaCollector, feed_health
from purgatory.adapters.kafka.clients._errors import KafkaUnavailableError, RecordTooLargeError


def _facts() -> Any:
    return SimpleNamespace(
        settings=SimpleNamespace(produce_timeout_ms=1000, topic_ready_timeout_ms=1000),
        unavailable=None,
    )


def _answers(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.labels["operation"], s.labels["status"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "purgatory_kafka_answers_total"
    }


def test_answer_code_is_none_for_success_else_the_first_error() -> None:
    produce = DelayedProduce(_facts(), [ProducerRecord("t", b"a"), ProducerRecord("t", b"b" * 10)])
    produce.report(0, None, None)
    produce.report(1, RecordTooLargeError("record too large (simulated)"), None)
    assert produce.force_complete()
    assert produce.answer_code() == "MESSAGE_TOO_LARGE"
    ok = DelayedProduce(_facts(), [ProducerRecord("t", b"a")])
    ok.report(0, None, None)
    assert ok.force_complete() and ok.answer_code() == "NONE"
    unavailable = DelayedTopicReady(_facts(), "t", delay_ms=1000)
    assert unavailable.refuse(ErrorCode.KAFKA_UNAVAILABLE, KafkaUnavailableError("silent (simulated)"))
    assert unavailable.answer_code() == "KAFKA_UNAVAILABLE"


def test_every_finished_operation_is_counted_once_by_type_and_status() -> None:
    registry = CollectorRegistry()
    registry.register(KafkaCollector(ANSWERS, feeds=list))
    before = _answers(registry)
    refused = DelayedProduce(_facts(), [ProducerRecord("t", b"x")])
    refused.report(0, RecordTooLargeError("record too large (simulated)"), None)
    assert refused.force_complete()
    assert not refused.force_complete(), "finished once"
    waiting = DelayedTopicReady(_facts(), "t", delay_ms=1000)
    assert waiting.refuse(ErrorCode.SHUTTING_DOWN)  # refused before any wait: counted all the same
    after = _answers(registry)
    key_refused = ("DelayedProduce", "MESSAGE_TOO_LARGE")
    key_shutdown = ("DelayedTopicReady", "SHUTTING_DOWN")
    assert after[key_refused] - before.get(key_refused, 0) == 1
    assert after[key_shutdown] - before.get(key_shutdown, 0) == 1


def test_feed_health_exports_age_and_outage_flag_per_kafka_purgatory() -> None:
    healthy = SimpleNamespace(unavailable=None, stats=SimpleNamespace(last_success=time.monotonic()))
    down = SimpleNamespace(
        unavailable="no broker answered (simulated)",
        stats=SimpleNamespace(last_success=time.monotonic() - 30),
    )
    registry = CollectorRegistry()
    registry.register(
        KafkaCollector(AnswerCounts(), feeds=lambda: [("a", healthy), ("b", down), ("b", healthy)])
    )
    samples = {
        (s.name, s.labels.get("name")): s.value for family in registry.collect() for s in family.samples
    }
    assert samples[("purgatory_kafka_unavailable", "a")] == 0.0
    assert samples[("purgatory_kafka_unavailable", "b")] == 1.0, "two named alike: the worse of them"
    assert samples[("purgatory_kafka_feed_last_success_age_seconds", "b")] >= 30.0
    assert samples[("purgatory_kafka_feed_last_success_age_seconds", "a")] < 30.0


def test_the_service_and_the_kafka_adapter_build_feed_health_from_one_function() -> None:
    feed = SimpleNamespace(unavailable=None, stats=SimpleNamespace(last_success=time.monotonic()))
    names = ("x_kafka_unavailable", "x_feed_last_success_age_seconds")
    families = feed_health(names, [((), feed)], [])
    assert [f.name for f in families] == list(names)
