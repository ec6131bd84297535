"""The journal pipeline: batch over files or a topic, or a Structured Streaming query on Kafka.

Output directory layout (Parquet tables, then ``report.html``):

* ``window_stats/`` — per (window, op_type): counts, expiry ratio, latency percentiles;
* ``key_counts/`` — per (window, op_type, key): operations created watching the key;
* ``hot_keys/`` (batch) — the top keys per (window, op_type), ranked;
* ``summary/`` (batch) — whole-journal totals and percentiles per op_type;
* ``bad_records/`` — every line that is not a valid event, with its source and reason;
* ``run.json`` — counts of the run: lines, events, duplicates removed, bad records by reason
  (streaming: also rows dropped as later than the watermark).

Duplicates (the same ``event_id`` twice: producer retries, re-sent files) are removed before any
counting: by ``dropDuplicates`` in batch, and in streaming by ``dropDuplicatesWithinWatermark``,
which remembers ids for the watermark's delay. Late events: batch sees the whole journal, so an
out-of-order event simply lands in its window. Streaming emits a window once the watermark
(the newest event time seen minus ``watermark``) passes its end (append mode: each window is
written once, final); an event older than the watermark is dropped and counted in ``run.json``
as ``late_rows_dropped``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from ._analysis import (
    DEFAULT_ACCURACY,
    DEFAULT_TOP_KEYS,
    aggregate,
    hot_keys,
    key_counts_of,
    stats_of,
    summary,
)
from ._parse import bad_records_of, classify, events_of

__all__ = ["RunSummary", "StreamingRun", "bad_counts", "run_batch", "start_streaming"]

RUN_FILE = "run.json"


@dataclass
class RunSummary:
    """What one run read and wrote; saved as ``run.json`` next to the tables."""

    mode: str
    source: str
    lines: int = 0
    events: int = 0
    duplicates_removed: int = 0
    bad_records: dict[str, int] = field(default_factory=dict)
    late_rows_dropped: int = 0
    windows: int = 0
    window: str = ""
    accuracy: int = DEFAULT_ACCURACY
    seconds: float = 0.0

    @property
    def bad_total(self) -> int:
        return sum(self.bad_records.values())

    def save(self, out_dir: Path) -> None:
        (out_dir / RUN_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, out_dir: Path) -> RunSummary:
        return cls(**json.loads((out_dir / RUN_FILE).read_text()))


def _table(out_dir: Path, name: str) -> str:
    return str(out_dir / name)


def run_batch(
    lines: DataFrame,
    out_dir: str | Path,
    *,
    source: str,
    window: str = "1 minute",
    accuracy: int = DEFAULT_ACCURACY,
    top_keys: int = DEFAULT_TOP_KEYS,
) -> RunSummary:
    """Analyse ``lines`` (``value``, ``source``) into the tables under ``out_dir``; overwrites them."""
    started = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = RunSummary(mode="batch", source=source, window=window, accuracy=accuracy)

    # Parsing is the expensive step: parse once, keep it, derive bad records and events from it.
    classified = classify(lines).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        by_reason = {row["reason"]: row["count"] for row in classified.groupBy("reason").count().collect()}
        run.lines = sum(by_reason.values())
        run.bad_records = dict(sorted((reason, n) for reason, n in by_reason.items() if reason is not None))
        bad_records_of(classified).write.mode("overwrite").parquet(_table(out, "bad_records"))

        events = events_of(classified).dropDuplicates(["event_id"]).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            aggregates = aggregate(events, window, accuracy).persist(StorageLevel.MEMORY_AND_DISK)
            try:
                stats = stats_of(aggregates)
                stats.write.mode("overwrite").parquet(_table(out, "window_stats"))
                # Every event is counted in exactly one stats row: the events analysed, from the
                # small aggregate instead of another pass over the events.
                totals = stats.agg(
                    F.sum(F.col("created") + F.col("completed") + F.col("expired") + F.col("cancelled")),
                    F.countDistinct("window_start"),
                ).first()
                run.events = int((totals[0] if totals else 0) or 0)
                run.windows = int((totals[1] if totals else 0) or 0)
                run.duplicates_removed = by_reason.get(None, 0) - run.events
                keys = key_counts_of(aggregates)
                keys.write.mode("overwrite").parquet(_table(out, "key_counts"))
                hot_keys(keys, top_keys).write.mode("overwrite").parquet(_table(out, "hot_keys"))
            finally:
                aggregates.unpersist()
            summary(events, accuracy).write.mode("overwrite").parquet(_table(out, "summary"))
        finally:
            events.unpersist()
    finally:
        classified.unpersist()
    run.seconds = round(time.monotonic() - started, 3)
    run.save(out)
    return run


@dataclass
class StreamingRun:
    """The two queries of a streaming analysis: aggregates (stateful) and bad records."""

    aggregates: StreamingQuery
    bad_records: StreamingQuery
    run: RunSummary
    out_dir: Path

    @property
    def queries(self) -> tuple[StreamingQuery, StreamingQuery]:
        return (self.aggregates, self.bad_records)

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for both queries (``available_now`` runs stop by themselves); True if both ended."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for query in self.queries:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if remaining is None:
                query.awaitTermination()
            elif not query.awaitTermination(math.ceil(remaining)):
                return False
        self._record_progress()
        return True

    def stop(self) -> None:
        for query in self.queries:
            query.stop()
        self._record_progress()

    def _record_progress(self) -> None:
        # Progress reports say how many rows each stateful operator dropped as too late.
        # recentProgress holds the last ~100 micro-batches: enough for a bounded (available-now)
        # run; a long-running query's totals live in Spark's metrics instead.
        late = lines = duplicates = 0
        for progress in self.aggregates.recentProgress:
            lines += int(progress.get("numInputRows", 0))
            for operator in progress.get("stateOperators", []):
                late += int(operator.get("numRowsDroppedByWatermark", 0))
                duplicates += int(operator.get("customMetrics", {}).get("numDroppedDuplicateRows", 0))
        self.run.late_rows_dropped += late
        self.run.lines += lines
        self.run.duplicates_removed += duplicates
        self.run.bad_records = bad_counts(self.out_dir)
        self.run.save(self.out_dir)


def _append_tables(out: Path) -> Callable[[DataFrame, int], None]:
    def write(aggregates: DataFrame, batch_id: int) -> None:
        # One directory per micro-batch, overwritten if Spark re-runs the batch after a failure:
        # the tables stay exactly-once although foreachBatch is at-least-once.
        aggregates.persist()
        try:
            for name, table in (
                ("window_stats", stats_of(aggregates)),
                ("key_counts", key_counts_of(aggregates)),
            ):
                table.write.mode("overwrite").parquet(str(out / name / f"batch={batch_id}"))
        finally:
            aggregates.unpersist()

    return write


def start_streaming(
    lines: DataFrame,
    out_dir: str | Path,
    checkpoint_dir: str | Path,
    *,
    source: str,
    window: str = "1 minute",
    watermark: str = "10 minutes",
    accuracy: int = DEFAULT_ACCURACY,
    available_now: bool = False,
    processing_time: str = "10 seconds",
) -> StreamingRun:
    """Start the streaming analysis of ``lines`` (a streaming DataFrame); resumes from the checkpoint.

    ``available_now``: process what the source holds now, then stop (a bounded run; state and
    offsets stay in the checkpoint for the next run). Otherwise a micro-batch every
    ``processing_time`` until stopped.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = Path(checkpoint_dir)
    run = RunSummary(mode="stream", source=source, window=window, accuracy=accuracy)
    if (out / RUN_FILE).exists():
        previous = RunSummary.load(out)  # a resumed query keeps counting where it stopped
        run.lines, run.late_rows_dropped = previous.lines, previous.late_rows_dropped
        run.duplicates_removed = previous.duplicates_removed
    trigger: dict[str, Any] = {"availableNow": True} if available_now else {"processingTime": processing_time}

    classified = classify(lines)
    bad_query = (
        bad_records_of(classified)
        .writeStream.format("parquet")
        .option("path", _table(out, "bad_records"))
        .option("checkpointLocation", str(checkpoints / "bad_records"))
        .queryName("journal_bad_records")
        .trigger(**trigger)
        .start()
    )
    events = (
        events_of(classified)
        .withWatermark("event_time", watermark)
        .dropDuplicatesWithinWatermark(["event_id"])
    )
    aggregate_query = (
        aggregate(events, window, accuracy)
        .writeStream.outputMode("append")
        .foreachBatch(_append_tables(out))
        .option("checkpointLocation", str(checkpoints / "aggregates"))
        .queryName("journal_aggregates")
        .trigger(**trigger)
        .start()
    )
    return StreamingRun(aggregate_query, bad_query, run, out)


def bad_counts(out_dir: Path) -> dict[str, int]:
    """Bad records by reason, read back from the table (streaming runs count them this way)."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    path = out_dir / "bad_records"
    if spark is None or not path.exists() or not any(path.glob("*.parquet")):
        return {}
    rows = spark.read.parquet(str(path)).groupBy("reason").count().collect()
    return {row["reason"]: row["count"] for row in sorted(rows, key=lambda r: r["reason"])}
