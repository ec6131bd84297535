"""``purgatory analyze`` in its own process: Spark's INFO/WARN log stays out of the user's terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from purgatory.journal.synthetic import synthetic_events

pytestmark = pytest.mark.spark

CLI_TIMEOUT_S = 240  # a JVM start and a small job; bounded so a hung Spark fails the test


def test_analyze_prints_no_spark_log_lines(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "a.jsonl").write_text("".join(e.to_json() + "\n" for e in synthetic_events(50)))
    command = [str(Path(sys.executable).with_name("purgatory")), "analyze", "--path", str(journal)]
    command += ["--out", str(tmp_path / "out"), "--master", "local[1]"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spark_lines = [line for line in done.stderr.splitlines() if " WARN " in line or " INFO " in line]
    assert spark_lines == [], f"Spark log reached the terminal: {spark_lines[:5]}"
    assert "Setting default log level" not in done.stderr
    assert "100 lines" in done.stdout
