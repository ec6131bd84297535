"""The journal's aggregates, one definition for batch and Structured Streaming.

Per operation type and tumbling event-time window (``window``, default one minute):

* ``created`` — operations submitted in the window (by their ``created`` event's time);
* ``completed`` / ``expired`` / ``cancelled`` — operations that *finished* in the window, by
  outcome; ``completed`` splits into ``completed_ok`` and ``completed_error``: an operation that
  finished early because of an error (its finish event's ``error_code`` is set and not ``NONE``:
  an unknown topic, a refused append, ``NOT_LEADER_OR_FOLLOWER``, Kafka unavailable) is
  completed *with error*, not a success; ``finished`` = completed + expired + cancelled;
  ``expiry_ratio = expired / finished`` and ``error_ratio = completed_error / finished`` (null
  when nothing finished; the report does not plot ratios of windows with fewer than
  ``MIN_RATIO_OPERATIONS`` finished operations: 3 operations make a ratio of 1.0 meaningless);
* ``latency_p50/p95/p99_ms`` — completion latency (completed operations finishing in the window,
  with or without error: each is an answer its caller waited for), from the caller's request to
  the answer, with Spark's ``percentile_approx``;
* key counts — per watch key, the operations created in the window that watch it; the hottest
  keys are the top ``n`` of these.

Accuracy of the percentiles: ``percentile_approx(col, p, accuracy)`` keeps a Greenwald-Khanna
quantile summary whose relative error is ``1 / accuracy``: for ``n`` values the returned value is
an actual input value whose rank differs from the exact rank ``ceil(p * n)`` by at most
``n / accuracy`` (default ``accuracy = 10000``: within 0.01 % of ``n`` ranks, so exact for windows
of fewer than 10,000 completions). Memory grows with ``accuracy``, not with ``n``.

Both kinds of rows come out of ONE grouping — stats rows with ``key = null``, key rows with the
key — so a streaming query keeps one state store and reads its source once.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "DEFAULT_ACCURACY",
    "DEFAULT_TOP_KEYS",
    "PERCENTILES",
    "aggregate",
    "completed_with_error",
    "hot_keys",
    "key_counts_of",
    "stats_of",
    "summary",
]

PERCENTILES = (0.5, 0.95, 0.99)
DEFAULT_ACCURACY = 10_000  # Spark's default: rank error <= n / 10,000 (see the module docstring)
DEFAULT_TOP_KEYS = 10
OUTCOME_COUNTS = ("created", "completed", "expired", "cancelled")
NO_ERROR = "NONE"  # the error_code of a successful answer (Kafka's Errors.NONE)


def completed_with_error() -> Column:
    """A ``completed`` event whose answer was an error (``error_code`` set and not ``NONE``)."""
    return _is("completed") & F.col("error_code").isNotNull() & (F.col("error_code") != NO_ERROR)


def _is(event_type: str) -> Column:
    return F.col("event_type") == event_type


def _measures(selected: Column, accuracy: int) -> list[Column]:
    """Aggregates over the rows where ``selected``: outcome counts and completion latency percentiles."""
    percentiles = F.array(*[F.lit(p) for p in PERCENTILES])
    completed_latency = F.when(selected & _is("completed"), F.col("latency_ms"))
    return [
        *[F.count(F.when(selected & _is(kind), 1)).alias(kind) for kind in OUTCOME_COUNTS],
        F.count(F.when(selected & completed_with_error(), 1)).alias("completed_error"),
        F.percentile_approx(completed_latency, percentiles, accuracy).alias("latency"),
    ]


def _derived() -> list[Column]:
    """The published columns computed from :func:`_measures`."""
    finished = F.col("completed") + F.col("expired") + F.col("cancelled")
    return [
        *[F.col(kind) for kind in OUTCOME_COUNTS],
        (F.col("completed") - F.col("completed_error")).alias("completed_ok"),
        F.col("completed_error"),
        finished.alias("finished"),
        F.when(finished > 0, F.col("expired") / finished).alias("expiry_ratio"),
        F.when(finished > 0, F.col("completed_error") / finished).alias("error_ratio"),
        *[F.col("latency")[i].alias(f"latency_p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)],
    ]


def aggregate(events: DataFrame, window: str, accuracy: int = DEFAULT_ACCURACY) -> DataFrame:
    """Stats rows and key rows per (window, op_type[, key]); see the module docstring.

    Each event becomes one row with ``key = null`` (its stats row), and a ``created`` event one
    more row per watch key — one ``explode``, no union, so the streaming planner sees a single
    windowed aggregation over the watermarked ``event_time``.
    """
    none = F.array(F.lit(None).cast("string"))
    dims = F.when(_is("created") & F.col("keys").isNotNull(), F.concat(none, F.col("keys"))).otherwise(none)
    rows = events.select(
        "event_time", "op_type", "event_type", "latency_ms", "error_code", F.explode(dims).alias("key")
    )
    stats_row = F.col("key").isNull()
    return rows.groupBy(F.window("event_time", window).alias("window"), "op_type", "key").agg(
        *_measures(stats_row, accuracy),
        F.count(F.when(~stats_row, 1)).alias("ops"),
    )


def stats_of(aggregates: DataFrame) -> DataFrame:
    """The ``window_stats`` table: one row per (window, op_type)."""
    return aggregates.where(F.col("key").isNull()).select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "op_type",
        *_derived(),
    )


def key_counts_of(aggregates: DataFrame) -> DataFrame:
    """The ``key_counts`` table: operations created per (window, op_type, key)."""
    return aggregates.where(F.col("key").isNotNull()).select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "op_type",
        "key",
        "ops",
    )


def hot_keys(key_counts: DataFrame, top: int = DEFAULT_TOP_KEYS) -> DataFrame:
    """The ``top`` keys per (window, op_type) by operations watching them; ties by key name."""
    rank = Window.partitionBy("window_start", "op_type").orderBy(F.desc("ops"), F.asc("key"))
    return key_counts.withColumn("rank", F.row_number().over(rank)).where(F.col("rank") <= top)


def summary(events: DataFrame, accuracy: int = DEFAULT_ACCURACY) -> DataFrame:
    """Whole-journal totals per op_type (batch only: percentiles need all events of a type)."""
    return events.groupBy("op_type").agg(*_measures(F.lit(True), accuracy)).select("op_type", *_derived())
