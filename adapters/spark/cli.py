"""``purgatory analyze``: the journal pipeline from the command line.

Imports PySpark only when the command runs, so ``purgatory --help`` stays fast and works without
the ``spark`` extra. Failures are one line naming the cause (exit code 2): the journal topic is
checked before Spark starts, and a failing Spark job is reported by its innermost Java cause,
not a Py4J stack. Spark's own log is quiet below ERROR; on a terminal a progress line shows the
running stages.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Annotated

import typer

from purgatory.settings import ConfigError, load_settings

from ..kafka.settings import BOOTSTRAP_ENV

__all__ = ["analyze"]

TOPIC_CHECK_TIMEOUT_S = 10.0  # one metadata request; a cluster that does not answer in 10 s is down


class Source(enum.Enum):
    files = "files"
    kafka = "kafka"


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=2)


def failure_cause(exc: BaseException) -> str:
    """One line for a failed Spark job: the innermost ``Caused by:`` of a Java stack, else the
    first line of the message (Py4J errors carry the whole JVM stack in their text)."""
    text = str(exc).strip()
    causes = [line.strip().removeprefix("Caused by: ") for line in text.splitlines() if "Caused by: " in line]
    line = causes[-1] if causes else (text.splitlines()[0] if text else type(exc).__name__)
    return line.strip()


def _check_topic(bootstrap: str, topic: str, kafka: object, extra: dict[str, str]) -> None:
    """Refuse, in one line, a topic that does not exist or a cluster that does not answer."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from ..kafka import client_config
    from ..kafka.settings import KafkaSettings

    assert isinstance(kafka, KafkaSettings)
    config: dict[str, str | int | float | bool] = {**client_config(kafka, bootstrap), "log_level": "0"}
    config.update({key.removeprefix("kafka."): value for key, value in extra.items()})
    try:
        # All topics, not list_topics(topic): that could auto-create it on some brokers.
        topics = AdminClient(config).list_topics(timeout=TOPIC_CHECK_TIMEOUT_S).topics
    except KafkaException as exc:
        raise _fail(f"Kafka at {bootstrap} did not answer: {failure_cause(exc)}") from None
    if topic not in topics:
        raise _fail(
            f"journal topic {topic!r} does not exist on {bootstrap} "
            "(set --topic or journal.topic; the journal's Kafka sink writes it)"
        )


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
    resolve_jars: Annotated[
        bool,
        typer.Option(
            "--resolve-jars", help="Fetch Spark's Kafka connector jars with Maven (once), then exit."
        ),
    ] = False,
) -> None:
    """Analyse the operation journal with Spark: counts, expiry ratio, latency percentiles, hot keys."""
    if resolve_jars:  # image builds and offline preparation: no Spark started, no journal read
        from ._jars import ConnectorJarsMissingError, connector_jars

        try:
            jars = connector_jars(resolve=True)
        except ConnectorJarsMissingError as exc:
            raise _fail(str(exc)) from None
        typer.echo(f"{len(jars)} connector jars in {jars[0].parent if jars else '?'}")
        return
    try:
        settings = load_settings()
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    js = settings.journal
    if stream and source is not Source.kafka:
        raise _fail("--stream reads the journal topic: add --source kafka")
    extra = _kafka_extra(kafka_option or [])

    from ._jars import ConnectorJarsMissingError, connector_jars
    from ._session import SparkEnvironmentError, artifacts_baseline, remove_stray_artifacts, spark_session

    jars = []
    bootstrap_servers = ""
    journal_topic = topic or js.topic
    if source is Source.kafka:
        from ..kafka import configured_bootstrap  # the provider's order: --bootstrap, env, settings

        bootstrap_servers = configured_bootstrap(settings.kafka, bootstrap) or ""
        if not bootstrap_servers:
            raise _fail(
                f"no Kafka to read from: pass --bootstrap host:port, set {BOOTSTRAP_ENV}, "
                "or set kafka.bootstrap_servers (start a local cluster with `purgatory kafka up`)"
            )
        try:
            jars = connector_jars()
        except ConnectorJarsMissingError as exc:
            raise _fail(str(exc)) from None
        _check_topic(bootstrap_servers, journal_topic, settings.kafka, extra)  # before Spark starts
    journal_path = path or Path(js.directory)
    if source is Source.files and not journal_path.exists():
        raise _fail(f"journal path {str(journal_path)!r} does not exist (set --path or journal.directory)")
    artifacts_before = artifacts_baseline()  # what Spark leaves in the working directory is removed
    try:
        spark = spark_session(master or js.spark_master, jars=jars)
    except SparkEnvironmentError as exc:
        raise _fail(str(exc)) from None

    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException, StreamingQueryException

    from ._job import run_batch, start_streaming
    from ._progress import SparkProgress
    from ._report import write_report
    from ._sources import file_lines, kafka_lines, kafka_options

    try:
        if not stream:
            if source is Source.files:
                label, lines = str(journal_path), file_lines(spark, journal_path)
            else:
                label = f"kafka topic {journal_topic}"
                lines = kafka_lines(spark, kafka_options(bootstrap_servers, journal_topic, extra))
            with SparkProgress(spark.sparkContext.statusTracker(), label):
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
    except (PySparkException, Py4JError) as exc:
        raise _fail(
            f"analysis of {journal_topic if source is Source.kafka else journal_path} failed: "
            f"{failure_cause(exc)}"
        ) from None
    finally:
        spark.stop()
        remove_stray_artifacts(artifacts_before)
    typer.echo(
        f"{label}: {run.lines:,} lines, {run.duplicates_removed:,} duplicates removed, "
        f"{run.bad_total:,} bad records {run.bad_records or ''}".rstrip()
    )
    typer.echo(f"tables in {out}/, report: {report}")
