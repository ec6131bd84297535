"""``purgatory bench pipeline``: rows/s of the batch journal job at two sizes (cost must be linear).

Generates a synthetic journal (``purgatory.journal.synthetic``; a block of up to one million
events is generated once and copied with fresh operation ids, so generation stays cheap), runs
the batch job over ``N/2`` and ``N`` events after a small warm-up run (JIT, class loading), and
prints rows/s for each plus the cost ratio ``(t_N / t_N/2) / 2`` — 1.0 means exactly linear.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["pipeline"]

BLOCK_EVENTS = 1_000_000  # generated once; larger journals are copies of it with fresh ids
WARMUP_EVENTS = 200_000  # enough rows for the JIT to compile the hot paths before the timed runs


# The larger run must take at least this much longer than the smaller (relative) before the
# difference is read as the cost of its extra rows: below it, run-to-run noise (a busy machine,
# JIT warm-up, GC) is as large as the difference, and the quotient is any number at all.
MIN_MARGINAL_SHARE = 0.10


def marginal_line(small: int, small_s: float, large: int, large_s: float) -> str:
    """The marginal rate (the extra rows over the extra time: the per-row cost without the
    job's fixed costs) and the fixed cost it implies — or, when the timings cannot say, why not.

    Only meaningful when the larger run took measurably longer (``MIN_MARGINAL_SHARE`` of the
    smaller's time): a larger run as fast or faster (it happens under load) gave "5e15 rows/s".
    """
    extra = large_s - small_s
    if large <= small or extra < MIN_MARGINAL_SHARE * small_s:
        how = "was faster than" if extra < 0 else "took hardly longer than"
        return (
            f"marginal rate: not measurable — the {large:,}-event run ({large_s:.2f} s) {how} the "
            f"{small:,}-event run ({small_s:.2f} s): run-to-run noise (fixed costs dominate, or the "
            f"machine was busy) is larger than the extra rows' cost; use more --events or --repeats"
        )
    marginal = (large - small) / extra
    fixed = small_s - small / marginal
    shown = f"; fixed cost per run ~{fixed:.1f} s" if fixed >= 0 else ""
    return f"marginal rate {marginal:,.0f} rows/s (extra rows over extra time){shown}"


def _write_journal(directory: Path, events: int) -> None:
    from purgatory.journal.synthetic import synthetic_events

    directory.mkdir(parents=True)
    block_events = min(events, BLOCK_EVENTS)
    block = "".join(line.to_json() + "\n" for line in synthetic_events(block_events // 2, seed=0))
    written = 0
    index = 0
    while written < events:
        take = min(block_events, events - written)
        text = block if take == block_events else "".join(block.splitlines(keepends=True)[:take])
        # A fresh op-id prefix per copy: every event id stays unique (no duplicates to remove).
        (directory / f"journal-{index:04d}.jsonl").write_text(text.replace('"syn0-', f'"syn0c{index}-'))
        written += take
        index += 1


def _time_job(master: str, journal: Path, out: Path, repeats: int, driver_memory: str) -> list[float]:
    from purgatory.adapters.spark.batch import file_lines, run_batch, spark_session

    spark = spark_session(master, app_name="purgatory-bench-pipeline", driver_memory=driver_memory)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run_batch(file_lines(spark, journal), out, source=str(journal))
        seconds.append(time.perf_counter() - started)
    return seconds


def pipeline(
    events: Annotated[
        int,
        typer.Option(min=1000, help="Events of the larger run (the smaller: half)."),
    ] = (10_000_000),
    repeats: Annotated[int, typer.Option(min=1, help="Runs per size; the median is reported.")] = 1,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[*]",
    driver_memory: Annotated[str, typer.Option(help="Driver JVM heap (local mode runs there).")] = "4g",
    workdir: Annotated[
        Path | None, typer.Option(help="Where to write journals (default: a temp dir).")
    ] = None,
) -> None:
    """Rows/s of `purgatory analyze` (batch, files) at N/2 and N journal events."""
    from purgatory.adapters.spark.batch import artifacts_baseline, remove_stray_artifacts

    base = Path(tempfile.mkdtemp(prefix="purgatory-bench-", dir=workdir))
    artifacts_before = artifacts_baseline()  # Spark's empty artifacts/ is not left behind
    try:
        sizes = [events // 2, events]
        warmup = min(WARMUP_EVENTS, events // 2)
        started = time.perf_counter()
        _write_journal(base / "journal-warmup", warmup)
        for size in sizes:
            _write_journal(base / f"journal-{size}", size)
        typer.echo(
            f"generated journals of {', '.join(f'{s:,}' for s in sizes)} events in "
            f"{time.perf_counter() - started:.1f} s (+ {warmup:,} warm-up)"
        )
        from purgatory.adapters.spark.batch import spark_session

        _time_job(master, base / "journal-warmup", base / "out-warmup", 1, driver_memory)
        medians = {}
        for size in sizes:
            seconds = _time_job(
                master,
                base / f"journal-{size}",
                base / f"out-{size}",
                repeats,
                driver_memory,
            )
            medians[size] = statistics.median(seconds)
            typer.echo(
                f"batch job, {size:>12,} events: {medians[size]:8.2f} s  "
                f"{size / medians[size]:>12,.0f} rows/s  (runs: {', '.join(f'{s:.2f}' for s in seconds)})"
            )
        small, large = sizes
        ratio = (medians[large] / medians[small]) / (large / small)
        typer.echo(f"cost ratio (t_N / t_N/2) / 2 = {ratio:.2f}  (1.00 = linear; < 1: fixed costs amortised)")
        typer.echo(marginal_line(small, medians[small], large, medians[large]))
        # Other processes on the machine change these figures: say how busy it was.
        typer.echo("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
        spark_session(master).stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
        remove_stray_artifacts(artifacts_before)
