"""``purgatory bench reliability`` prints the table and writes the JSON report (small load, no Kafka)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from purgatory.cli import app


def test_bench_reliability_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "reliability",
            "--operations",
            "20000",
            "--threads",
            "4",
            "--no-kafka",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    for heading in ("Load held", "Faults", "Bad inputs", "lost = 0, double = 0"):
        assert heading in result.output, f"{heading!r} missing from the table"
    (path,) = tmp_path.glob("reliability-*.json")
    report = json.loads(path.read_text())
    summary = report["summary"]
    assert report["ok"] is True
    assert summary["operations"] == 20000 and summary["threads"] == 4
    assert summary["lost"] == 0 and summary["double"] == 0
    assert summary["faults_survived"] == summary["faults_run"] == 1  # the callback faults
    assert summary["bad_inputs_tried"] == summary["bad_inputs_refused"] > 250
    assert report["faults_not_run"] == {"Kafka faults": "--no-kafka"}
