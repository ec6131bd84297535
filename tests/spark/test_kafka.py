"""The journal through a real Kafka topic: the idempotent sink, batch reads, Structured Streaming.

Uses the session's real local Kafka (``kafka_bootstrap``, ``kafka_topic_factory`` from
``tests/kafka/kafka_fixtures.py``) and the session's local[2] Spark with the connector jars.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest
from purgatory.adapters.kafka.journal_sink import KafkaJournalSink
from purgatory.adapters.spark._job import RunSummary, run_batch, start_streaming
from purgatory.adapters.spark._sources import kafka_lines, kafka_options
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from purgatory import DelayedOperationPurgatory, MockTimer
from purgatory.journal import EventType, Journal, JournalEvent, MemoryJournalSink
from purgatory.journal.synthetic import DEFAULT_START_MS, synthetic_events

from ..core.ops import MockDelayedOperation
from .expected import WINDOW_MS, answers

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

STREAM_TIMEOUT_S = 240  # one available-now run on local[2]: a few micro-batches of a few seconds
WATERMARK_MS = 5 * WINDOW_MS


def _send(bootstrap: str, topic: str, events: Sequence[JournalEvent]) -> KafkaJournalSink:
    sink = KafkaJournalSink({"bootstrap.servers": bootstrap}, topic)
    sink.write(events)
    sink.close()  # flushes: every record acknowledged by all in-sync replicas, or it raises
    assert sink.delivery_errors == 0 and sink.delivered == len(events)
    return sink


def _stats(spark: SparkSession, out: Path) -> dict[tuple[int, str], dict[str, object]]:
    rows = (
        spark.read.parquet(str(out / "window_stats")).withColumn("w", F.unix_millis("window_start")).collect()
    )
    assert len(rows) == len({(r["w"], r["op_type"]) for r in rows}), "each window is written once"
    return {(r["w"], r["op_type"]): r.asDict() for r in rows}


def test_journal_to_kafka_then_batch_analysis_keeps_each_operation_in_order(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic_factory: object, tmp_path: Path
) -> None:
    topic = kafka_topic_factory(3, prefix="journal")  # type: ignore[operator]
    # A real purgatory journaled to Kafka (and to a collecting sink, to know the exact events).
    collected = MemoryJournalSink()
    kafka_sink = KafkaJournalSink({"bootstrap.servers": kafka_bootstrap}, topic)
    journal = Journal([kafka_sink, collected], flush_interval_s=0.01)
    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "Fetch", timer=MockTimer(), reaper_enabled=False
    )
    journal.attach(purgatory)
    ops = [MockDelayedOperation(100) for _ in range(20)]
    try:
        for index, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [f"orders-{index % 4}"])
        for op in ops[:12]:
            op.completable = True
        for key in range(4):
            purgatory.check_and_complete(f"orders-{key}")
        purgatory._timer.advance_clock(200)  # the other 8 expire
    finally:
        purgatory.shutdown()
        journal.close()
    assert journal.stats().failed == 0 and kafka_sink.delivered == 40
    synthetic = list(synthetic_events(500, seed=21, span_ms=3 * WINDOW_MS))
    _send(kafka_bootstrap, topic, synthetic)

    run = run_batch(kafka_lines(spark, kafka_options(kafka_bootstrap, topic)), tmp_path / "out", source=topic)
    everything = collected.events + synthetic
    assert run.lines == len(everything) and run.events == len(everything) and run.bad_total == 0
    stats = _stats(spark, tmp_path / "out")
    for cell, answer in answers(everything).items():
        for kind in ("created", "completed", "expired", "cancelled"):
            assert stats[cell][kind] == answer.counts[kind], f"{kind} in {cell}"
    journaled = [s for (w, op_type), s in stats.items() if op_type == "MockDelayedOperation"]
    assert sum(s["completed"] for s in journaled) == 12 and sum(s["expired"] for s in journaled) == 8  # type: ignore[misc]

    # Keyed by operation id: both events of an operation on one partition, created first.
    records = (
        spark.read.format("kafka")
        .options(**kafka_options(kafka_bootstrap, topic))
        .option("startingOffsets", "earliest")
        .load()
        .select(F.col("key").cast("string"), "partition", "offset", F.col("value").cast("string"))
        .collect()
    )
    placed: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for record in records:
        placed[record["key"]].append(
            (record["partition"], record["offset"], JournalEvent.from_json(record["value"]).event_type.value)
        )
    assert len(placed) == 520
    for op_id, where in placed.items():
        assert len({partition for partition, _, _ in where}) == 1, f"{op_id} spread over partitions: {where}"
        assert sorted(where)[0][2] == "created", f"{op_id} out of order: {where}"
    assert len({partition for where in placed.values() for partition, _, _ in where}) == 3


def test_streaming_counts_once_across_restarts_and_drops_late_events(
    spark: SparkSession, kafka_bootstrap: str, kafka_topic_factory: object, tmp_path: Path
) -> None:
    topic = kafka_topic_factory(2, prefix="journal-stream")  # type: ignore[operator]
    out, checkpoints = tmp_path / "out", tmp_path / "checkpoints"
    options = kafka_options(kafka_bootstrap, topic)
    start = DEFAULT_START_MS
    first = list(synthetic_events(300, seed=31, start_ms=start, span_ms=3 * WINDOW_MS))
    # An event half an hour on moves the watermark (30 min - 5 min) past the first three windows.
    clock = JournalEvent(
        "clock-1:created", EventType.CREATED, "clock-1", "Clock", "Clock", start + 30 * WINDOW_MS
    )
    resent = random.Random(4).sample(first, 40)  # a producer restart re-sent these: same ids
    _send(kafka_bootstrap, topic, [*first, *resent, clock])

    def run_once() -> RunSummary:
        streaming = start_streaming(
            kafka_lines(spark, options, stream=True),
            out,
            checkpoints,
            source=topic,
            watermark=f"{WATERMARK_MS // 60_000} minutes",
            available_now=True,
        )
        assert streaming.await_termination(STREAM_TIMEOUT_S), "available-now run did not finish in time"
        for query in streaming.queries:
            assert query.exception() is None, query.exception()
        return streaming.run

    first_run = run_once()
    stats = _stats(spark, out)
    expected = answers(first)
    assert set(stats) == set(expected), (
        "the three windows behind the watermark are emitted, the clock's is not"
    )
    for cell, answer in expected.items():
        for kind in ("created", "completed", "expired", "cancelled"):
            assert stats[cell][kind] == answer.counts[kind], f"{kind} in {cell} (duplicates must not count)"
    assert first_run.duplicates_removed == 40

    # Second run, resumed from the checkpoint: a late event for the first window (behind the
    # watermark: dropped, counted), a bad line, and a later clock that closes the first clock's window.
    late = JournalEvent(
        "late-1:created",
        EventType.CREATED,
        "late-1",
        "DelayedFetch",
        "Fetch",
        start + 1_000,
        ("topic-0",),
        500,
    )
    clock2 = JournalEvent(
        "clock-2:created", EventType.CREATED, "clock-2", "Clock", "Clock", start + 60 * WINDOW_MS
    )
    _send(kafka_bootstrap, topic, [late, clock2])
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, value=b"{not json")
    assert producer.flush(30) == 0

    second_run = run_once()
    after = _stats(spark, out)
    clock_cell = (start + 30 * WINDOW_MS, "Clock")
    assert set(after) == set(expected) | {clock_cell}
    assert after[clock_cell]["created"] == 1
    for cell in expected:
        assert after[cell] == stats[cell], f"{cell} changed: the late event must not reopen a window"
    assert second_run.late_rows_dropped >= 1, "the late event is counted as dropped"
    assert second_run.lines == len(first) + len(resent) + 1 + 3, "each record read once across restarts"
    assert second_run.bad_records == {"malformed_json": 1}
