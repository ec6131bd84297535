"""Journal lines → typed events, and bad lines → ``bad_records`` with a reason. Nothing vanishes.

Input: a DataFrame with a string column ``value`` (one JSON line per row — a file line or a Kafka
record's value) plus any provenance columns (file name; topic, partition, offset). Output: the
same rows split in two, every input row landing in exactly one of them:

* events — ``event_id, event_type, op_type, latency_ms, keys, error_code, event_time``
  (``event_time`` = ``ts_ms`` as a UTC timestamp; ``error_code`` null when the journal's
  operations do not say, as a journal written before it existed): what the aggregates need;
* bad records — ``value``, the provenance columns and ``reason``:
  ``malformed_json`` (not a JSON object, or a field of the wrong type), ``unknown_event_type``,
  ``missing_field`` (an id, type, purgatory, timestamp, or a finish event's latency is missing).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

__all__ = [
    "ANALYSIS_COLUMNS",
    "EVENT_TYPES",
    "JOURNAL_SCHEMA",
    "bad_records_of",
    "classify",
    "events_of",
]

EVENT_TYPES = ("created", "completed", "expired", "cancelled")
FINISH_TYPES = EVENT_TYPES[1:]
CORRUPT = "_corrupt_record"

JOURNAL_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("event_type", T.StringType()),
        T.StructField("op_id", T.StringType()),
        T.StructField("op_type", T.StringType()),
        T.StructField("purgatory", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("keys", T.ArrayType(T.StringType())),
        T.StructField("timeout_ms", T.LongType()),
        T.StructField("latency_ms", T.DoubleType()),
        T.StructField("error_code", T.StringType()),
        # PERMISSIVE mode puts the raw line here when it is not JSON or a field has the wrong type.
        T.StructField(CORRUPT, T.StringType()),
    ]
)
# What the aggregates read; the rest of an event (op_id, purgatory, timeout) is not carried along.
PARSED_COLUMNS = ("event_id", "event_type", "op_type", "latency_ms", "keys", "error_code")
ANALYSIS_COLUMNS = (*PARSED_COLUMNS, "event_time")
REQUIRED = ("event_id", "op_id", "op_type", "purgatory", "ts_ms")


def _reason(parsed: Column) -> Column:
    missing = F.lit(False)
    for name in REQUIRED:
        missing = missing | parsed[name].isNull()
    finish_without_latency = parsed["event_type"].isin(*FINISH_TYPES) & parsed["latency_ms"].isNull()
    return (
        F.when(parsed.isNull() | parsed[CORRUPT].isNotNull(), F.lit("malformed_json"))
        .when(parsed["event_type"].isNull(), F.lit("missing_field"))
        .when(~parsed["event_type"].isin(*EVENT_TYPES), F.lit("unknown_event_type"))
        .when(missing | finish_without_latency, F.lit("missing_field"))
    )


def classify(lines: DataFrame) -> DataFrame:
    """Parse ``value`` into one narrow row per line: ``reason`` (null for a good event), the
    analysis columns (``ANALYSIS_COLUMNS``) for good rows, ``value``/``source`` for bad rows.

    Narrow on purpose: the batch job caches this, and dropping the raw line of good rows (they
    are most rows) and the fields no aggregate uses keeps the cache and the dedup shuffle small.
    """
    parsed = F.from_json(
        F.col("value"), JOURNAL_SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    )
    with_parsed = lines.withColumn("parsed", parsed).withColumn("reason", _reason(F.col("parsed")))
    bad = F.col("reason").isNotNull()
    return with_parsed.select(
        "reason",
        F.when(bad, F.col("value")).alias("value"),
        F.when(bad, F.col("source")).alias("source"),
        *[F.col(f"parsed.{name}").alias(name) for name in PARSED_COLUMNS],
        F.timestamp_millis(F.col("parsed.ts_ms")).alias("event_time"),
    )


def events_of(classified: DataFrame) -> DataFrame:
    """The good rows of :func:`classify`: ``ANALYSIS_COLUMNS``."""
    return classified.where(F.col("reason").isNull()).select(*ANALYSIS_COLUMNS)


def bad_records_of(classified: DataFrame) -> DataFrame:
    """The bad rows of :func:`classify`: the raw line, its provenance and the reason."""
    return classified.where(F.col("reason").isNotNull()).select("value", "source", "reason")
