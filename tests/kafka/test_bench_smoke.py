"""The Kafka benchmark runs end to end on a small workload (figures come from ``purgatory bench kafka``)."""

from __future__ import annotations

import pytest
from purgatory.adapters.kafka.bench import run_once

from purgatory.settings import KafkaSettings
from tests.kafka.kafka_fixtures import TopicFactory

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
    assert result.floor_p50_ms > 0, "the bare consumer read the window's records"
    # 50 produces wait on each partition; an advance tries only those it completes (OffsetIndex).
    assert 1.0 <= result.tries_per_advance < 5.0, result


def test_bench_runs_ours_and_the_bare_consumer_alone_for_floor_alternate(
    kafka_settings: KafkaSettings,
) -> None:
    """``--floor alternate``: each side in its own run, the other's figures absent (NaN)."""
    import math

    ours = run_once(kafka_settings, pending=200, partitions=4, rate=100.0, duration_s=1.0, floor=False)
    assert ours.completions > 0 and ours.lag_p50_ms > 0
    assert math.isnan(ours.floor_p50_ms), "no bare consumer ran"
    alone = run_once(kafka_settings, pending=200, partitions=4, rate=100.0, duration_s=1.0, ours=False)
    assert alone.completions == 0 and alone.pending_at_end == 0, "no operation was submitted"
    assert alone.floor_p50_ms > 0, "the bare consumer read the window's records"
    with pytest.raises(ValueError, match="nothing to measure"):
        run_once(
            kafka_settings, pending=200, partitions=4, rate=100.0, duration_s=1.0, ours=False, floor=False
        )


def test_request_reply_bench_answers_every_request_on_both_sides(kafka_bootstrap: str) -> None:
    """``purgatory bench request-reply``'s run on the session cluster, a short, slow run per side."""
    import uuid

    from purgatory.tools.bench import request_reply

    topics = request_reply._create_bench_topics(kafka_bootstrap, 1)
    responder = request_reply._ResponderProcess(
        topics.requests, f"smoke-{uuid.uuid4().hex[:6]}", kafka_bootstrap, 2
    )
    try:
        for side in ("purgatory", "hand-rolled"):
            result = request_reply.run_once(
                side, kafka_bootstrap, topics.requests, 1, reply_topic=topics.replies,
                rate=50.0, warmup_s=0.2, duration_s=1.0, timeout_ms=10_000,
                responder_pid=responder.process.pid,
            )  # fmt: skip
            assert result.timeouts == 0 and result.answered == result.sent == 50, result
            assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
            assert result.responder_cpu_us_per_request > 0, "the responder process's CPU is read"
    finally:
        responder.stop()
    assert responder.process.returncode == 0, "the responder stopped on SIGTERM (no SIGKILL needed)"


@pytest.mark.parametrize("mode", ["push", "poll"])
def test_produce_bench_reads_back_only_on_the_read_back_side(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory, mode: str
) -> None:
    """``purgatory bench produce``: both sides answer every produce NONE; only one reads back."""
    from purgatory.adapters.kafka.produce_bench import run_once as produce_once

    topic = kafka_topic_factory(2)
    for read_back in (True, False):
        result = produce_once(
            kafka_settings,
            topic,
            mode=mode,
            read_back=read_back,
            brokers=1,
            sequential=5,
            burst=10,
            threads=2,
        )
        assert result.failed == 0, result
        assert 0 < result.seq_p50_ms <= result.seq_p99_ms and result.burst_per_s > 0
        reads = result.kafka_reads + result.shared_hits
        assert reads > 0 if read_back else reads == 0, result
