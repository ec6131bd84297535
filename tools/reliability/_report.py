"""The reliability report: load held, faults survived, bad inputs tried — as a table and as JSON."""

from __future__ import annotations

import collections
import datetime as dt
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ._bad_input import BadInputOutcome
from ._faults import FaultResult
from ._soak import SoakResult

__all__ = ["ReliabilityReport"]

_MIB = 1024 * 1024


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / _MIB:.1f} MiB"


@dataclass
class ReliabilityReport:
    """Everything one ``purgatory bench reliability`` run measured."""

    soak: SoakResult
    faults: list[FaultResult] = field(default_factory=list)
    skipped_faults: dict[str, str] = field(default_factory=dict)  # scenario -> why it did not run
    bad_inputs: list[BadInputOutcome] = field(default_factory=list)
    soak_rounds: int = 1  # rounds run (each checked); ``soak`` is the last
    soak_seconds: float = 0.0  # all rounds together

    @property
    def ok(self) -> bool:
        return (
            self.soak.ok
            and all(f.survived for f in self.faults)
            and all(outcome.ok for outcome in self.bad_inputs)
        )

    def bad_input_counts(self) -> dict[str, tuple[int, int]]:
        """Per category: (tried, refused with the right typed error)."""
        counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for outcome in self.bad_inputs:
            entry = counts[outcome.case.category]
            entry[0] += 1
            entry[1] += outcome.ok
        return {category: (tried, refused) for category, (tried, refused) in counts.items()}

    # -- rendering -----------------------------------------------------------------------------

    def print(self, console: Console) -> None:
        s = self.soak
        load = Table(title="Load held (soak)", title_justify="left")
        load.add_column("measure")
        load.add_column("value", justify="right")
        rows = [
            ("operations", f"{s.operations:,}"),
            ("threads", str(s.threads)),
            ("keys", f"{s.keys:,}"),
            ("duration", f"{s.seconds:.1f} s"),
            ("rounds (total time)", f"{self.soak_rounds} ({self.soak_seconds or s.seconds:.1f} s)"),
            ("throughput", f"{s.ops_per_second:,.0f} ops/s"),
            (
                "completed / expired",
                f"{s.completed:,} / {s.expired:,} ({s.expired / s.operations:.1%} expired)",
            ),
            ("lost", str(s.lost)),
            ("double", str(s.double)),
            ("wrong on_expiration", str(s.wrong_expirations)),
            ("watched() after purge", str(s.watched_after_purge)),
            ("num_delayed() at the end", str(s.delayed_after_finish)),
            (
                "RSS start / peak / end",
                f"{_mib(s.rss_start_bytes)} / {_mib(s.rss_peak_bytes)} / {_mib(s.rss_end_bytes)}",
            ),
            ("RSS retained (allowed)", f"{_mib(s.rss_retained_bytes)} ({_mib(s.rss_tolerance_bytes)})"),
            ("live blocks retained (allowed)", f"{s.blocks_retained:,} ({s.blocks_tolerance:,})"),
            ("threads left behind", ", ".join(s.threads_left) or "0"),
        ]
        for name, value in rows:
            load.add_row(name, value)
        console.print(load)

        faults = Table(title="Faults", title_justify="left")
        for column in ("fault", "survived", "ops affected", "how they ended", "user-code errors", "seconds"):
            faults.add_column(column)
        for f in self.faults:
            ended = ", ".join(f"{k}: {v}" for k, v in f.outcomes.items())
            faults.add_row(
                f.name,
                "yes" if f.survived else "[red]NO[/]: " + "; ".join(f.problems),
                str(f.affected),
                ended,
                str(f.user_code_errors),
                f"{f.seconds:.1f}",
            )
        for name, why in self.skipped_faults.items():
            faults.add_row(name, f"not run: {why}", "", "", "", "")
        console.print(faults)

        bad = Table(title="Bad inputs", title_justify="left")
        for column in ("category", "tried", "refused with a typed error naming it"):
            bad.add_column(column, justify="right" if column != "category" else "left")
        for category, (tried, refused) in self.bad_input_counts().items():
            bad.add_row(category, str(tried), str(refused))
        console.print(bad)
        for outcome in self.bad_inputs:
            if not outcome.ok:
                console.print(
                    f"[red]bad input accepted or mis-reported[/] {outcome.case.name}: {outcome.error}"
                )

        survived = sum(f.survived for f in self.faults)
        tried = len(self.bad_inputs)
        refused = sum(o.ok for o in self.bad_inputs)
        console.print(
            f"[bold]load held:[/] {s.operations:,} ops, {s.threads} threads, {s.seconds:.1f} s   "
            f"[bold]faults survived:[/] {survived}/{len(self.faults)}   "
            f"[bold]bad inputs refused:[/] {refused}/{tried}   "
            f"[bold]lost = {s.lost}, double = {s.double}[/]   "
            + ("[green]OK[/]" if self.ok else "[red]FAILED[/]")
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "load": self.soak.as_dict(),
            "faults": [f.as_dict() for f in self.faults],
            "faults_not_run": dict(self.skipped_faults),
            "bad_inputs": {
                "by_category": {
                    c: {"tried": t, "refused": r} for c, (t, r) in self.bad_input_counts().items()
                },
                "failures": [{"case": o.case.name, "error": o.error} for o in self.bad_inputs if not o.ok],
            },
            "summary": {
                "operations": self.soak.operations,
                "threads": self.soak.threads,
                "seconds": round(self.soak.seconds, 3),
                "soak_rounds": self.soak_rounds,
                "soak_seconds": round(self.soak_seconds or self.soak.seconds, 3),
                "lost": self.soak.lost,
                "double": self.soak.double,
                "faults_survived": sum(f.survived for f in self.faults),
                "faults_run": len(self.faults),
                "bad_inputs_tried": len(self.bad_inputs),
                "bad_inputs_refused": sum(o.ok for o in self.bad_inputs),
            },
            "environment": {
                "python": sys.version.split()[0],
                "platform": platform.platform(),
            },
        }

    def save(self, directory: Path) -> Path:
        """Write the report as ``reliability-<UTC stamp>.json`` under ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        path = directory / f"reliability-{stamp}.json"
        path.write_text(json.dumps(self.as_dict(), indent=1, default=str) + "\n")
        return path
