"""``purgatory analyze``: the journal pipeline from the command line.

Imports PySpark only when the command runs, so ``purgatory --help`` stays fast and works without
the ``spark`` extra.
"""

from __future__ import annotations

import enum
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from purgatory.settings import ConfigError, load_settings

__all__ = ["analyze"]

BOOTSTRAP_ENV = "PURGATORY_KAFKA_BOOTSTRAP"


class Source(enum.Enum):
    files = "files"
    kafka = "kafka"


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=2)


def _kafka_extra(pairs: list[str]) -> dict[str, str]:
    extra: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise _fail(f"--kafka-option {pair!r}: expected key=value (a Kafka client setting)")
        extra[key] = value
    return extra


def analyze(
    source: Annotated[
        Source,
        typer.Option(help="Read the journal from files or from its Kafka topic."),
    ] = (Source.files),
    path: Annotated[
        Path | None,
        typer.Option(help="Journal file or directory (default: journal.directory)."),
    ] = None,
    topic: Annotated[str | None, typer.Option(help="Journal topic (default: journal.topic).")] = None,
    bootstrap: Annotated[
        str | None,
        typer.Option(help=f"Kafka bootstrap servers (default: {BOOTSTRAP_ENV} or kafka.*)."),
    ] = None,
    stream: Annotated[
        bool, typer.Option(help="Structured Streaming from Kafka (with checkpointing).")
    ] = False,
    available_now: Annotated[
        bool,
        typer.Option(help="Streaming: process what the topic holds now, then stop."),
    ] = False,
    run_seconds: Annotated[
        float | None,
        typer.Option(help="Streaming: stop after this many seconds (default: Ctrl-C)."),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Streaming checkpoint directory (default: <out>/_checkpoints)."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Output directory: Parquet tables and report.html.")] = Path(
        "journal-analysis"
    ),
    master: Annotated[str | None, typer.Option(help="Spark master (default: journal.spark_master).")] = None,
    window: Annotated[str | None, typer.Option(help="Window width, e.g. '1 minute'.")] = None,
    watermark: Annotated[
        str | None, typer.Option(help="Streaming lateness bound, e.g. '10 minutes'.")
    ] = None,
    accuracy: Annotated[
        int, typer.Option(min=1, help="percentile_approx accuracy (error n/accuracy).")
    ] = 10_000,
    top_keys: Annotated[int, typer.Option(min=1, help="Hottest keys kept per window and type.")] = 10,
    kafka_option: Annotated[
        list[str] | None,
        typer.Option(help="Extra Kafka client setting key=value (repeatable)."),
    ] = None,
) -> None:
    """Analyse the operation journal with Spark: counts, expiry ratio, latency percentiles, hot keys."""
    try:
        settings = load_settings()
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    js = settings.journal
    if stream and source is not Source.kafka:
        raise _fail("--stream reads the journal topic: add --source kafka")
    extra = _kafka_extra(kafka_option or [])

    from ._jars import ConnectorJarsMissingError, connector_jars
    from ._session import SparkEnvironmentError, spark_session

    jars = []
    bootstrap_servers = ""
    journal_topic = topic or js.topic
    if source is Source.kafka:
        bootstrap_servers = (
            bootstrap or os.environ.get(BOOTSTRAP_ENV) or settings.kafka.bootstrap_servers or ""
        )
        if not bootstrap_servers:
            raise _fail(
                f"no Kafka to read from: pass --bootstrap host:port, set {BOOTSTRAP_ENV}, "
                "or set kafka.bootstrap_servers (start a local cluster with `purgatory kafka up`)"
            )
        try:
            jars = connector_jars()
        except ConnectorJarsMissingError as exc:
            raise _fail(str(exc)) from None
    journal_path = path or Path(js.directory)
    if source is Source.files and not journal_path.exists():
        raise _fail(f"journal path {str(journal_path)!r} does not exist (set --path or journal.directory)")
    try:
        spark = spark_session(master or js.spark_master, jars=jars)
    except SparkEnvironmentError as exc:
        raise _fail(str(exc)) from None

    from pyspark.errors import StreamingQueryException

    from ._job import run_batch, start_streaming
    from ._report import write_report
    from ._sources import file_lines, kafka_lines, kafka_options

    try:
        if not stream:
            if source is Source.files:
                label, lines = str(journal_path), file_lines(spark, journal_path)
            else:
                label = f"kafka topic {journal_topic}"
                lines = kafka_lines(spark, kafka_options(bootstrap_servers, journal_topic, extra))
            run = run_batch(
                lines, out, source=label, window=window or js.window, accuracy=accuracy, top_keys=top_keys
            )
        else:
            label = f"kafka topic {journal_topic} (streaming)"
            streaming = start_streaming(
                kafka_lines(spark, kafka_options(bootstrap_servers, journal_topic, extra), stream=True),
                out,
                checkpoint or out / "_checkpoints",
                source=label,
                window=window or js.window,
                watermark=watermark or js.watermark,
                accuracy=accuracy,
                available_now=available_now,
            )
            typer.echo(f"streaming from {journal_topic}; checkpoint in {checkpoint or out / '_checkpoints'}")
            if available_now:
                streaming.await_termination()
            else:
                try:
                    # Returns when a query stops (or fails: reported below) or the time is up.
                    spark.streams.awaitAnyTermination(None if run_seconds is None else math.ceil(run_seconds))
                except KeyboardInterrupt:
                    typer.echo("stopping the streaming queries…")
                except StreamingQueryException:
                    pass  # the failed query's exception is reported below
                streaming.stop()
            for query in streaming.queries:
                error = query.exception()
                if error is not None:
                    raise _fail(f"streaming query {query.name} failed: {error}")
            run = streaming.run
        report = write_report(out)
    finally:
        spark.stop()
    typer.echo(
        f"{label}: {run.lines:,} lines, {run.duplicates_removed:,} duplicates removed, "
        f"{run.bad_total:,} bad records {run.bad_records or ''}".rstrip()
    )
    typer.echo(f"tables in {out}/, report: {report}")
