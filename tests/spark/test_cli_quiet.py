"""``purgatory analyze`` in its own process: Spark's INFO/WARN log stays out of the user's terminal,
and nothing is left in the working directory (only ``--out`` is written: issue 28)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from purgatory.adapters.spark._session import artifacts_baseline, remove_stray_artifacts

from purgatory.journal.synthetic import synthetic_events

pytestmark = pytest.mark.spark

CLI_TIMEOUT_S = 240  # a JVM start and a small job; bounded so a hung Spark fails the test


def test_analyze_prints_no_spark_log_lines_and_writes_only_under_out(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "a.jsonl").write_text("".join(e.to_json() + "\n" for e in synthetic_events(50)))
    command = [str(Path(sys.executable).with_name("purgatory")), "analyze", "--path", str(journal)]
    command += ["--out", str(tmp_path / "out"), "--master", "local[1]"]
    work = tmp_path / "work"  # the user's working directory: Spark 4 left artifacts/ here
    work.mkdir()
    done = subprocess.run(
        command,
        cwd=work,
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
    assert sorted(work.iterdir()) == [], "analyze writes only under --out"
    assert (tmp_path / "out" / "report.html").exists()


def test_only_the_empty_spark_directories_a_run_made_are_removed(tmp_path: Path) -> None:
    users = tmp_path / "artifacts" / "spark-users-own"
    users.mkdir(parents=True)
    (users / "keep.txt").write_text("mine")
    before = artifacts_baseline(tmp_path)
    made = tmp_path / "artifacts" / "spark-0d9f"
    (made / "sub").mkdir(parents=True)  # what a session leaves: empty directories
    remove_stray_artifacts(before, tmp_path)
    assert not made.exists()
    assert (users / "keep.txt").read_text() == "mine", "the user's artifacts/ and its files stay"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    baseline = artifacts_baseline(fresh)
    (fresh / "artifacts" / "spark-1").mkdir(parents=True)
    remove_stray_artifacts(baseline, fresh)
    assert list(fresh.iterdir()) == [], "an artifacts/ this run made is gone with it"
