"""The Kafka benchmark runs end to end on a small workload (figures come from ``purgatory bench kafka``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.tools.bench.kafka.feed import run_once

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

    from purgatory.tools.bench.reply import request_reply

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


def test_produce_bench_prints_both_sides_and_their_ratios(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``purgatory bench produce``: a tiny run (1 broker, 1 repeat) of the library and the HTTP
    sides, ours and the plain producer, every produce answered, the same-run ratios printed."""
    import json

    import typer
    from purgatory.tools.bench.kafka.produce import produce
    from typer.testing import CliRunner

    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", kafka_bootstrap)  # the session cluster
    app = typer.Typer()
    app.command()(produce)
    app.command("unused")(lambda: None)  # two commands: typer keeps the name "produce"
    args = ["produce", "--brokers", "1", "--repeats", "1", "--records", "40", "--sequential-records", "5"]
    args += ["--concurrency", "8", "--partitions", "2", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for api in ("library", "http"):
        assert f"{api}, 1 broker(s), our linger" in result.output, result.output
    for workload in ("sequential", "c8"):
        assert result.output.count(f"{workload:<10} ours/plain: throughput") == 2, result.output
        assert result.output.count(f"{workload:<10} purgatory") == 2, result.output
        assert result.output.count(f"{workload:<10} plain") == 2, result.output
    assert "failures" not in result.output, "every produce of both sides was answered"
    (saved,) = tmp_path.glob("produce-*.json")
    cases = json.loads(saved.read_text())["cases"]
    assert [(c["brokers"], c["api"]) for c in cases] == [(1, "library"), (1, "http")]
    for case in cases:
        for row in case["summary"]:
            assert set(row["met"]) == {"per_s", "p99_ms", "cpu_us"}
            assert all(row["medians"][side]["per_s"] > 0 for side in ("purgatory", "plain")), row
