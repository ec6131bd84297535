"""Failed answers reach the journal and the report (issue 28, item 5), with real Kafka and Spark.

A produce of a record larger than the topic's ``max.message.bytes`` is refused by the broker:
the caller gets ``MESSAGE_TOO_LARGE`` (a failed append). A fetch of a partition past
the topic's count is answered at once, before any purgatory holds it. Both must be in the
journal with their error code and the caller's latency, and the batch analysis must count them
as completed *with error*, apart from the successful produce next to them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from purgatory.adapters.kafka import ErrorCode, KafkaPurgatory, ProducerRecord, TopicPartitionKey
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.spark._job import run_batch
from purgatory.adapters.spark._report import write_report
from purgatory.adapters.spark._sources import file_lines
from pyspark.sql import SparkSession

from purgatory.settings import Settings

from ..kafka.kafka_fixtures import TopicFactory

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

CALL_TIMEOUT_S = 60  # one produce's delivery report (or refusal) on a loaded machine
MAX_MESSAGE_BYTES = 1024  # the topic's limit: the refused record is 4 KiB (the client allows 1 MiB)


def _journal_events(directory: Path) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


async def _drive(kp: KafkaPurgatory, topic: str) -> tuple[Any, Any, Any]:
    aio = kp.aio
    ok = await asyncio.wait_for(
        aio.produce([ProducerRecord(topic, b"ok")], timeout_ms=30_000), CALL_TIMEOUT_S
    )
    refused = await asyncio.wait_for(
        aio.produce([ProducerRecord(topic, b"x" * (4 * MAX_MESSAGE_BYTES))], timeout_ms=30_000),
        CALL_TIMEOUT_S,
    )
    fetched = await asyncio.wait_for(
        aio.fetch({TopicPartitionKey(topic, 7): 0}, max_wait_ms=5_000), CALL_TIMEOUT_S
    )
    return ok, refused, fetched


def test_refused_produce_and_refused_fetch_are_journaled_and_reported_as_completed_with_error(
    spark: SparkSession, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic_factory(
        1, prefix="journal-failures", config={"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    )
    journal_dir = tmp_path / "journal"
    settings = Settings(
        kafka=kafka_settings,
        journal={"enabled": True, "sinks": ["file"], "directory": str(journal_dir), "flush_interval_ms": 10},
    )
    kp = KafkaPurgatory.connect(settings, name="journal-failures")
    try:
        ok, refused, fetched = asyncio.run(_drive(kp, topic))
    finally:
        kp.close()  # closes the journal: every event is in the files now

    assert ok.succeeded, ok
    assert refused.record_statuses == (ErrorCode.MESSAGE_TOO_LARGE,), refused
    assert fetched.statuses == {TopicPartitionKey(topic, 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}

    events = _journal_events(journal_dir)
    finishes = [e for e in events if e["event_type"] != "created"]
    by_type: dict[str, list[dict[str, object]]] = {}
    for event in finishes:
        by_type.setdefault(str(event["op_type"]), []).append(event)
    produce_codes = sorted(str(e["error_code"]) for e in by_type["DelayedProduce"])
    assert produce_codes == ["MESSAGE_TOO_LARGE", "NONE"], finishes
    # The fetch never reached a purgatory (answered at the partition check): journaled all the same.
    assert [e["error_code"] for e in by_type["DelayedFetch"]] == ["UNKNOWN_TOPIC_OR_PARTITION"], finishes
    assert all(e["event_type"] == "completed" for e in finishes)
    assert all(isinstance(e["latency_ms"], float) and e["latency_ms"] >= 0.0 for e in finishes)
    created = {e["op_id"] for e in events if e["event_type"] == "created"}
    assert created == {e["op_id"] for e in finishes}, "each answered op has its created event"

    out = tmp_path / "analysis"
    run_batch(file_lines(spark, journal_dir), out, source=str(journal_dir), window="1 minute")
    summary = {row["op_type"]: row for row in spark.read.parquet(str(out / "summary")).collect()}
    produce = summary["DelayedProduce"]
    assert (produce["completed"], produce["completed_ok"], produce["completed_error"]) == (2, 1, 1)
    assert produce["expired"] == 0
    fetch = summary["DelayedFetch"]
    assert (fetch["created"], fetch["completed_ok"], fetch["completed_error"]) == (1, 0, 1)
    page = write_report(out).read_text(encoding="utf-8")
    assert "completed_error" in page
