"""``purgatory analyze`` refuses what it cannot do with the exact remedy (no Spark JVM started)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from purgatory.adapters.spark._jars import (
    ConnectorJarsMissingError,
    connector_jars,
    jars_dir,
    pom_path,
    resolve_command,
)
from typer.testing import CliRunner

from purgatory.cli import app


def test_missing_connector_jars_name_the_maven_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PURGATORY_SPARK_JARS_DIR", str(tmp_path))
    with pytest.raises(ConnectorJarsMissingError) as caught:
        connector_jars("4.0.0")
    command = shlex.join(resolve_command("4.0.0"))
    assert command in str(caught.value)
    assert f"-DoutputDirectory={tmp_path / '4.0.0'}" in command
    assert f"-f {pom_path()}" in command and "-Dspark.version=4.0.0" in command
    assert pom_path().is_file(), "the pom ships with the package"


def test_cached_jars_are_found_without_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_SPARK_JARS_DIR", str(tmp_path))
    directory = jars_dir("9.9.9")
    directory.mkdir(parents=True)
    for name in ("spark-sql-kafka-0-10_2.13-9.9.9.jar", "kafka-clients-3.9.0.jar"):
        (directory / name).write_bytes(b"")
    assert [jar.name for jar in connector_jars("9.9.9")] == [
        "kafka-clients-3.9.0.jar",
        "spark-sql-kafka-0-10_2.13-9.9.9.jar",
    ]


def test_analyze_from_kafka_without_jars_prints_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PURGATORY_SPARK_JARS_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["analyze", "--source", "kafka", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "dependency:copy-dependencies" in result.output and "mvn" in result.output


def test_analyze_stream_needs_the_kafka_source() -> None:
    result = CliRunner().invoke(app, ["analyze", "--stream"])
    assert result.exit_code == 2
    assert "--stream reads the journal topic: add --source kafka" in result.output


def test_analyze_refuses_a_missing_journal_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = CliRunner().invoke(app, ["analyze", "--path", str(missing), "--master", "local[1]"])
    assert result.exit_code == 2
    assert f"journal path {str(missing)!r} does not exist" in result.output


def test_a_failed_spark_job_is_reported_by_its_innermost_java_cause() -> None:
    from purgatory.adapters.spark.cli import failure_cause

    py4j_text = (
        "An error occurred while calling o42.load.\n"
        ": org.apache.spark.SparkException: Job aborted.\n"
        "\tat org.apache.spark.sql.Dataset.collect(Dataset.scala:3)\n"
        "Caused by: org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node\n"
        "\tat org.apache.kafka.clients.admin.KafkaAdminClient.call(KafkaAdminClient.java:1)\n"
    )
    assert failure_cause(RuntimeError(py4j_text)) == (
        "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node"
    )
    assert failure_cause(ValueError("first line\nsecond")) == "first line"


def test_the_progress_line_sums_the_active_stages_tasks() -> None:
    from types import SimpleNamespace

    from purgatory.adapters.spark._progress import stage_summary

    stages = {3: SimpleNamespace(numTasks=8, numCompletedTasks=5), 4: None}

    class Tracker:
        def getActiveStageIds(self) -> list[int]:
            return [4, 3]

        def getStageInfo(self, stage_id: int) -> object:
            return stages[stage_id]

    assert stage_summary(Tracker()) == ("stage 3", 5, 8)
