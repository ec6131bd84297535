"""Prometheus metrics: Kafka's names, per purgatory, present exactly while it lives."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from purgatory import DelayedOperationPurgatory
from purgatory.metrics import register_metrics
from purgatory.testing import MockTimer

from .ops import MockDelayedOperation


def test_metrics_are_exported_under_kafka_names_while_the_purgatory_lives() -> None:
    registry = CollectorRegistry()
    register_metrics(registry)
    register_metrics(registry)  # idempotent
    timer = MockTimer()
    p: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "Produce", timer=timer, reaper_enabled=False
    )
    p.try_complete_else_watch(MockDelayedOperation(10), ["a", "b"])
    p.try_complete_else_watch(MockDelayedOperation(50), ["a"])
    text = generate_latest(registry).decode()
    assert 'kafka_server_DelayedOperationPurgatory_PurgatorySize{delayedOperation="Produce"} 3.0' in text
    assert (
        'kafka_server_DelayedOperationPurgatory_NumDelayedOperations{delayedOperation="Produce"} 2.0' in text
    )
    timer.advance_clock(10)
    text = generate_latest(registry).decode()
    # jmx_exporter's Kafka rule turns the ExpiresPerSec meter into ..._Expires_total.
    assert 'kafka_server_DelayedOperationPurgatory_Expires_total{delayedOperation="Produce"} 1.0' in text
    assert (
        'kafka_server_DelayedOperationPurgatory_ExpiresPerSec_total{delayedOperation="Produce"} 1.0' in text
    ), "the earlier name is kept for existing dashboards"
    p.shutdown()
    text = generate_latest(registry).decode()
    assert 'delayedOperation="Produce"' not in text, "metrics are removed at shutdown"


def test_purgatories_sharing_a_name_are_summed_under_one_label() -> None:
    registry = CollectorRegistry()
    register_metrics(registry)
    purgatories: list[DelayedOperationPurgatory[MockDelayedOperation]] = [
        DelayedOperationPurgatory("produce", timer=MockTimer(), reaper_enabled=False) for _ in range(2)
    ]
    try:
        for p in purgatories:
            p.try_complete_else_watch(MockDelayedOperation(10), ["a"])
        text = generate_latest(registry).decode()
    finally:
        for p in purgatories:
            p.shutdown()
    assert text.count('NumDelayedOperations{delayedOperation="produce"}') == 1
    assert 'NumDelayedOperations{delayedOperation="produce"} 2.0' in text, "one sample, the sum"
