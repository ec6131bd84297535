"""Where journal lines come from: files (batch), a Kafka topic (batch or Structured Streaming).

Every source yields ``value`` (the JSON line) and ``source`` (provenance for bad records:
the file path, or ``topic:partition:offset``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["file_lines", "kafka_lines", "kafka_options"]

SEGMENT_GLOB = "*.jsonl"  # FileJournalSink's segments; a single file path is read whatever its name


def file_lines(spark: SparkSession, path: str | Path) -> DataFrame:
    """Lines of a journal file, or of every ``*.jsonl`` segment in a directory (recursively)."""
    reader = spark.read
    if Path(path).is_dir():
        reader = reader.option("pathGlobFilter", SEGMENT_GLOB).option("recursiveFileLookup", "true")
    lines = reader.text(str(path))
    return lines.select("value", F.col("_metadata.file_path").alias("source"))


def kafka_options(
    bootstrap_servers: str, topic: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Options of Spark's Kafka source; ``extra`` keys are Kafka client settings (``kafka.`` added)."""
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic}
    for key, value in (extra or {}).items():
        options[key if key.startswith("kafka.") else f"kafka.{key}"] = value
    return options


def kafka_lines(spark: SparkSession, options: Mapping[str, str], *, stream: bool = False) -> DataFrame:
    """The topic's records: as one batch (earliest to latest offsets now), or as a stream (from
    the earliest offset on first start, then from the checkpoint's)."""
    records: DataFrame
    if stream:
        # Retention may delete journal records before a stopped query resumes: carry on, Spark
        # logs the gap, rather than refusing to analyse anything.
        records = (
            spark.readStream.format("kafka")
            .options(**options)
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")
            .load()
        )
    else:
        records = (
            spark.read.format("kafka")
            .options(**options)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
    position = [F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string")]
    return records.select(
        F.col("value").cast("string").alias("value"), F.concat_ws(":", *position).alias("source")
    )
