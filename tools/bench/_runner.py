"""Side-by-side runs: every side in its own subprocess, alternating order, repeated; medians.

A *comparison* is one case (say W1 at N=100k) measured for a subject (this project) and its
baselines. Repeat ``r`` runs the sides in an order rotated by ``r`` so that no side always runs
first (or last) on a machine whose load drifts. Each repeat gives a same-run ratio
baseline / subject; the reported ratio is the median of those (docs/performance.md's method), next
to the median of each side's own figures.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._worker import RESULT_MARKER
from .measure import ChildFailed, result_of_child

__all__ = ["Comparison", "SideSpec", "Target", "run_comparison", "side_env", "side_specs"]

PURE_SUFFIX = "_pure"  # a side named "<side>_pure" runs the same side with PURGATORY_PURE=1
WORKER_TIMEOUT_S = 1800.0


class BenchError(RuntimeError):
    """A benchmark side failed (its process exited non-zero or broke a correctness check)."""


@dataclass(frozen=True)
class Target:
    """What the issue asks: ``baseline``'s figure over the subject's >= ``min_ratio``, or the
    subject's figure within ``limit`` (absolute)."""

    description: str
    baseline: str | None = None
    min_ratio: float | None = None
    limit: float | None = None


@dataclass
class SideSpec:
    name: str
    spec: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


def side_specs(bench: str, sides: Iterable[str], params: dict[str, Any], seed: int) -> list[SideSpec]:
    """One side per name, each running ``bench`` with the same parameters and seed."""
    return [SideSpec(side, {"bench": bench, "side": side, "params": params, "seed": seed}) for side in sides]


@dataclass
class Comparison:
    bench: str
    case: str
    metric: str  # the figure compared (lower is better for every metric used)
    unit: str
    subject: str
    sides: list[SideSpec]
    targets: list[Target] = field(default_factory=list)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    error: str | None = None  # why the comparison could not be completed (a side failed)

    def values(self, side: str) -> list[float]:
        return [float(run[self.metric]) for run in self.runs.get(side, [])]

    def median(self, side: str) -> float:
        values = self.values(side)
        return statistics.median(values) if values else float("nan")

    def ratios(self, baseline: str) -> list[float]:
        """Same-repeat ratios baseline / subject (> 1: the subject is better)."""
        subject = self.values(self.subject)
        base = self.values(baseline)
        return [b / s for b, s in zip(base, subject, strict=False) if s > 0]

    def ratio(self, baseline: str) -> float:
        ratios = self.ratios(baseline)
        return statistics.median(ratios) if ratios else float("nan")

    def verdicts(self) -> list[tuple[Target, float, bool]]:
        out: list[tuple[Target, float, bool]] = []
        if self.error is not None:
            return [(target, float("nan"), False) for target in self.targets]
        for target in self.targets:
            if target.baseline is not None and target.min_ratio is not None:
                value = self.ratio(target.baseline)
                out.append((target, value, value >= target.min_ratio))
            elif target.limit is not None:
                value = self.median(self.subject)
                out.append((target, value, value <= target.limit))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "case": self.case,
            "metric": self.metric,
            "unit": self.unit,
            "subject": self.subject,
            "medians": {side.name: self.median(side.name) for side in self.sides},
            "ratios": {
                side.name: {"median": self.ratio(side.name), "per_repeat": self.ratios(side.name)}
                for side in self.sides
                if side.name != self.subject
            },
            "targets": [
                {"target": t.description, "value": value, "met": met} for t, value, met in self.verdicts()
            ],
            "runs": self.runs,
            "error": self.error,
        }


def side_env(name: str) -> dict[str, str]:
    return {"PURGATORY_PURE": "1"} if name.endswith(PURE_SUFFIX) else {}


def _run_side(side: SideSpec) -> dict[str, Any]:
    env = {**os.environ, **side.env}
    if not side.env.get("PURGATORY_PURE"):
        env.pop("PURGATORY_PURE", None)
    try:
        result: dict[str, Any] = result_of_child(
            [sys.executable, "-m", "purgatory.tools.bench._worker", json.dumps(side.spec)],
            env=env,
            timeout_s=WORKER_TIMEOUT_S,
            marker=RESULT_MARKER,
        )
    except ChildFailed as exc:
        raise BenchError(f"side {side.name!r} of {side.spec} failed ({exc})") from None
    return result


def run_comparison(comparison: Comparison, repeats: int, step: Callable[[str], None] | None = None) -> None:
    """Run every side ``repeats`` times, in rotated order; results land in ``comparison.runs``.

    A failing side ends this comparison (``comparison.error``), not the others: the figures
    already measured are kept and the failure is reported next to them.
    """
    sides = comparison.sides
    for repeat in range(repeats):
        shift = repeat % len(sides)
        for side in sides[shift:] + sides[:shift]:
            if step is not None:
                step(f"{comparison.bench} {comparison.case}: {side.name} ({repeat + 1}/{repeats})")
            try:
                result = _run_side(side)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                comparison.error = str(exc)
                return
            comparison.runs.setdefault(side.name, []).append(result)
