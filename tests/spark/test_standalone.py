"""The analytics on Spark's own cluster manager: a standalone master and two workers on loopback.

``purgatory analyze --master spark://…`` (a subprocess, as a user runs it) against a local
standalone cluster started from pyspark's bundled ``spark-class`` (:class:`LocalSparkStandalone`,
stopped by PID), compared with the same command on ``local[2]``: the same tables.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from purgatory.adapters.spark.standalone import LocalSparkStandalone

from purgatory.journal.synthetic import synthetic_events

pytestmark = pytest.mark.spark

OPS = 2000
TABLES = ("window_stats", "key_counts", "hot_keys", "summary", "bad_records")
# Two Spark applications and five JVMs; measured 3.5 min for the local run alone with the shared
# 2-core machine at load average 20. Bounded all the same.
ANALYZE_TIMEOUT_S = 420.0


def _analyze(journal: Path, out: Path, master: str) -> None:
    command = [
        str(Path(sys.executable).with_name("purgatory")),
        "analyze",
        "--path",
        str(journal),
        "--out",
        str(out),
        "--master",
        master,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=ANALYZE_TIMEOUT_S)
    assert done.returncode == 0, f"analyze on {master} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def _rows(out: Path, table: str) -> list[tuple[object, ...]]:
    data = pq.read_table(out / table).to_pylist()
    return sorted((tuple(sorted(row.items())) for row in data), key=repr)


@pytest.mark.timeout(1200)
def test_analyze_on_a_standalone_cluster_gives_the_local_tables(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    lines = [event.to_json() for event in synthetic_events(OPS, seed=3, span_ms=3 * 60_000)]
    for index in range(2):  # two files: two input splits, one per worker
        (journal / f"journal-{index}.jsonl").write_text("".join(line + "\n" for line in lines[index::2]))
    _analyze(journal, tmp_path / "local", "local[2]")
    with LocalSparkStandalone(workers=2, work_dir=tmp_path / "spark") as cluster:
        assert cluster.master_url.startswith("spark://127.0.0.1:")
        pids = cluster.pids
        assert len(pids) == 3, "a master and two workers"
        _analyze(journal, tmp_path / "cluster", cluster.master_url)
        workers_log = "".join((tmp_path / "spark" / f"worker-{i}.log").read_text() for i in (1, 2))
        assert "Launching executor" in workers_log or "Asked to launch executor" in workers_log, (
            "the job really ran on the workers"
        )
    for pid in pids:
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), f"Spark JVM {pid} stopped"
    for table in TABLES:
        assert _rows(tmp_path / "cluster", table) == _rows(tmp_path / "local", table), f"{table} differs"
    summary = pq.read_table(tmp_path / "local" / "summary").to_pylist()
    finished = sum(row["completed"] + row["expired"] + row["cancelled"] for row in summary)
    assert finished == OPS, (
        "every synthetic operation is counted once (the comparison is not of empty tables)"
    )
