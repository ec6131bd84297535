"""Printing and saving results: a rich table on the terminal, a JSON file under bench-results/."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from purgatory import _accel

from ._runner import Comparison

__all__ = ["DEFAULT_RESULTS_DIR", "print_comparisons", "save_results"]

DEFAULT_RESULTS_DIR = Path("bench-results")


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def print_comparisons(console: Console, title: str, comparisons: Sequence[Comparison]) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("case")
    table.add_column("figure")
    sides: list[str] = []
    for comparison in comparisons:
        for spec in comparison.sides:
            if spec.name not in sides:
                sides.append(spec.name)
    for name in sides:
        table.add_column(f"{name} (median)", justify="right")
    table.add_column("ratio vs baselines (median of same-run ratios)")
    table.add_column("target")
    for comparison in comparisons:
        ratios = ", ".join(
            f"{spec.name}: {_fmt(comparison.ratio(spec.name))}x"
            for spec in comparison.sides
            if spec.name != comparison.subject
        )
        verdicts = "; ".join(
            f"[{'green' if met else 'red'}]{'MET' if met else 'MISSED'}[/] {t.description} ({_fmt(value)})"
            for t, value, met in comparison.verdicts()
        )
        cells = [_fmt(comparison.median(name)) if name in comparison.runs else "" for name in sides]
        if comparison.error is not None:
            verdicts = f"[red]FAILED[/] {comparison.error.splitlines()[-1]}"
        table.add_row(comparison.case, comparison.unit, *cells, ratios, verdicts)
    console.print(table)
    gc_table = Table(title="cyclic GC during the measured phase (medians)", title_justify="left")
    for column in ("case", "side", "gen0", "gen1", "gen2", "GC ms"):
        gc_table.add_column(column, justify="left" if column in ("case", "side") else "right")
    for comparison in comparisons:
        for side, runs in comparison.runs.items():
            if (
                runs
                and "gc_counts" in runs[-1]
                and comparison.metric == _first_metric(comparisons, comparison)
            ):
                counts = [statistics.median(run["gc_counts"][g] for run in runs) for g in range(3)]
                gc_ms = statistics.median(run["gc_ms"] for run in runs)
                gc_table.add_row(comparison.case, side, *(f"{c:g}" for c in counts), f"{gc_ms:.1f}")
    if gc_table.row_count:
        console.print(gc_table)


def _first_metric(comparisons: Sequence[Comparison], comparison: Comparison) -> str:
    # Comparisons sharing one set of runs (several figures of the same runs): GC rows once.
    for other in comparisons:
        if other.runs is comparison.runs:
            return other.metric
    return comparison.metric


def _environment() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": load,
        "purgatory_variant": _accel.status(),
    }


def save_results(
    bench: str, comparisons: Sequence[Comparison], options: dict[str, Any], directory: Path, extra: Any = None
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"{bench}-{stamp}.json"
    payload = {
        "bench": bench,
        "created": stamp,
        "options": options,
        "environment": _environment(),
        "comparisons": [c.as_dict() for c in comparisons],
    }
    if extra is not None:
        payload["extra"] = extra
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path
