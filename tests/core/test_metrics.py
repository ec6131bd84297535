"""Prometheus metrics: Kafka's names, per purgatory, present exactly while it lives."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from purgatory import DelayedOperationPurgatory, Outcome
from purgatory._metrics import LATENCY_BASE_NS, LATENCY_BUCKETS, PurgatoryStats, latency_bucket
from purgatory.metrics import LATENCY_METRIC, register_metrics
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
    assert "ExpiresPerSec_total" not in text, "the deprecated duplicate of ..._Expires_total is gone"
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


@pytest.mark.parametrize(
    ("latency_ns", "bucket"),
    [
        (0, 0),
        (LATENCY_BASE_NS - 1, 0),
        (LATENCY_BASE_NS, 1),
        (2 * LATENCY_BASE_NS - 1, 1),
        (2 * LATENCY_BASE_NS, 2),
        ((LATENCY_BASE_NS << (LATENCY_BUCKETS - 1)) - 1, LATENCY_BUCKETS - 1),
        (LATENCY_BASE_NS << (LATENCY_BUCKETS - 1), LATENCY_BUCKETS),
        (10**18, LATENCY_BUCKETS),
    ],
)
def test_latency_bucket_bounds(latency_ns: int, bucket: int) -> None:
    """Bucket k holds latencies below LATENCY_BASE_NS << k; past the last bound, +Inf."""
    assert latency_bucket(latency_ns) == bucket, f"{latency_ns} ns belongs in bucket {bucket}"
    if bucket < LATENCY_BUCKETS:
        assert latency_ns < LATENCY_BASE_NS << bucket
    if bucket > 0:
        assert latency_ns >= LATENCY_BASE_NS << (bucket - 1), "the smallest bucket that holds it"


def test_stats_count_latency_per_outcome() -> None:
    stats = PurgatoryStats()
    stats.count(Outcome.COMPLETED, 0)
    stats.count(Outcome.COMPLETED, 3_000_000)  # 3 ms: below 4 ms, bucket 4
    stats.count(Outcome.EXPIRED, 200_000_000)  # 200 ms: below 256 ms, bucket 10
    stats.count(Outcome.CANCELLED, -5)  # a clock that went back counts as 0
    latency = stats.latency()
    completed, completed_sum = latency["completed"]
    assert completed[0] == 1 and completed[4] == 1 and sum(completed) == 2
    assert completed_sum == 3_000_000
    expired, expired_sum = latency["expired"]
    assert expired[10] == 1 and sum(expired) == 1 and expired_sum == 200_000_000
    assert latency["cancelled"][0][0] == 1
    assert stats.as_dict() == {"completed": 2, "expired": 1, "cancelled": 1, "user_code_errors": 0}


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exported:\n{text}")


def test_latency_histogram_is_exported_per_purgatory_and_outcome() -> None:
    """Submission to finish on the purgatory's clock (a MockTimer's mock time here): an operation
    completed 3 ms after submission lands below le=0.004, one expiring at 50 ms below 0.064."""
    registry = CollectorRegistry()
    register_metrics(registry)
    timer = MockTimer()
    p: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "Fetch", timer=timer, reaper_enabled=False
    )
    try:
        quick = MockDelayedOperation(1000)
        p.try_complete_else_watch(quick, ["a"])
        slow = MockDelayedOperation(50)
        p.try_complete_else_watch(slow, ["b"])
        timer.advance_clock(3)
        quick.completable = True
        assert p.check_and_complete("a") == 1
        timer.advance_clock(47)
        assert slow.outcome is Outcome.EXPIRED
        at_once = MockDelayedOperation(1000)
        at_once.completable = True
        assert p.try_complete_else_watch(at_once, ["a"])
        text = generate_latest(registry).decode()
    finally:
        p.shutdown()
    series = LATENCY_METRIC + '_bucket{delayedOperation="Fetch",le="%s",outcome="%s"}'
    assert _sample(text, series % ("0.00025", "completed")) == 1.0, "completed on submission: 0 ms"
    assert _sample(text, series % ("0.002", "completed")) == 1.0
    assert _sample(text, series % ("0.004", "completed")) == 2.0, "the 3 ms completion, cumulative"
    assert _sample(text, series % ("+Inf", "completed")) == 2.0
    assert _sample(text, series % ("0.032", "expired")) == 0.0
    assert _sample(text, series % ("0.064", "expired")) == 1.0, "expired after its 50 ms"
    assert _sample(text, series % ("+Inf", "cancelled")) == 0.0
    count = LATENCY_METRIC + '_count{delayedOperation="Fetch",outcome="completed"}'
    assert _sample(text, count) == 2.0
    total = LATENCY_METRIC + '_sum{delayedOperation="Fetch",outcome="expired"}'
    assert _sample(text, total) == pytest.approx(0.05)
