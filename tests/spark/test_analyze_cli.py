"""``purgatory analyze --source kafka`` against a real cluster: failures are one line with the cause."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from purgatory.adapters.spark import _jars
from typer.testing import CliRunner

from purgatory.cli import app

pytestmark = pytest.mark.kafka


def _fake_connector_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jars present (empty files): the command gets past the jar check to the topic check."""
    import pyspark

    monkeypatch.setenv("PURGATORY_SPARK_JARS_DIR", str(tmp_path))
    directory = _jars.jars_dir(pyspark.__version__)
    directory.mkdir(parents=True)
    for name in (f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar", "kafka-clients-3.9.0.jar"):
        (directory / name).write_bytes(b"")


def test_a_missing_journal_topic_is_one_line_naming_it(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_connector_jars(tmp_path, monkeypatch)
    topic = f"no-journal-{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(
        app, ["analyze", "--source", "kafka", "--bootstrap", kafka_bootstrap, "--topic", topic]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, f"one line, not a traceback: {result.output}"
    assert f"journal topic {topic!r} does not exist on {kafka_bootstrap}" in lines[0]
    assert "Traceback" not in result.output and "py4j" not in result.output.lower()
