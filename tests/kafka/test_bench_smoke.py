"""The Kafka benchmark runs end to end on a small workload (figures come from ``purgatory bench kafka``)."""

from __future__ import annotations

import pytest
from purgatory.adapters.kafka.bench import run_once

from purgatory.settings import KafkaSettings

pytestmark = pytest.mark.kafka


def test_bench_completes_operations_and_keeps_requests_per_poll_constant(
    kafka_settings: KafkaSettings,
) -> None:
    result = run_once(kafka_settings, pending=200, partitions=4, rate=100.0, duration_s=1.0)
    assert result.completions > 0, "records appended during the window completed operations"
    assert result.pending_at_end == 200, "each completed operation was replaced"
    # ListOffsets(latest) every poll, DescribeTopics every 5th; DelayedProduce reads no log start.
    assert 1.0 <= result.requests_per_poll <= 1.5, "one or two batched requests per poll for one topic"
    assert result.lag_p50_ms > 0
