"""A short in-process demonstration: key events complete some operations, the timer expires the rest."""

from __future__ import annotations

import dataclasses
import threading
import time

from rich.console import Console

from ._operation import DelayedOperation
from ._outcome import Outcome
from ._purgatory import DelayedOperationPurgatory

__all__ = ["DemoSummary", "run_demo"]


class _WaitForCount(DelayedOperation):
    """Finishes once ``counter[key] >= target`` — a stand-in for "offset N was replicated"."""

    def __init__(
        self, number: int, key: str, target: int, counters: dict[str, int], delay_ms: int, report: _Report
    ) -> None:
        super().__init__(delay_ms)
        self.number, self.key, self.target, self.counters = number, key, target, counters
        self.report = report

    def try_complete(self) -> bool:
        if self.counters.get(self.key, 0) >= self.target:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.report.finished(self)


@dataclasses.dataclass
class DemoSummary:
    submitted: int = 0
    completed: int = 0
    expired: int = 0
    lost: int = 0
    double_finished: int = 0


class _Report:
    def __init__(self, console: Console, start: float) -> None:
        self.console, self.start = console, start
        self.lock = threading.Lock()
        self.finishes: dict[int, int] = {}
        self.all_done = threading.Event()
        self.expected = 0

    def finished(self, op: _WaitForCount) -> None:
        elapsed_ms = (time.monotonic() - self.start) * 1000
        colour = "green" if op.outcome is Outcome.COMPLETED else "yellow"
        self.console.print(
            f"[{colour}]op {op.number:>3} {op.outcome.value if op.outcome else '?':<9}[/] "
            f"key={op.key} target={op.target:<3} after {elapsed_ms:7.1f} ms"
        )
        with self.lock:
            self.finishes[op.number] = self.finishes.get(op.number, 0) + 1
            if len(self.finishes) == self.expected:
                self.all_done.set()


def run_demo(operations: int = 12, console: Console | None = None) -> DemoSummary:
    console = console or Console()
    purgatory: DelayedOperationPurgatory[_WaitForCount] = DelayedOperationPurgatory("demo")
    counters: dict[str, int] = {}
    report = _Report(console, time.monotonic())
    report.expected = operations
    keys = ["orders-0", "orders-1", "payments-0"]
    console.print(
        f"[bold]Submitting {operations} operations; every third waits for a count that never comes."
    )
    ops = []
    for n in range(operations):
        key = keys[n % len(keys)]
        target = 10 * (n // len(keys) + 1) if n % 3 != 2 else 10_000
        op = _WaitForCount(n, key, target, counters, delay_ms=300 + 20 * n, report=report)
        ops.append(op)
        purgatory.try_complete_else_watch(op, [key])
    console.print(f"watched={purgatory.watched()} delayed={purgatory.num_delayed()}; producing key events…")
    for step in range(1, 6):
        for key in keys:
            counters[key] = counters.get(key, 0) + 10
            purgatory.check_and_complete(key)
        time.sleep(0.02 * step)
    report.all_done.wait(timeout=10)
    purgatory.shutdown()
    summary = DemoSummary(submitted=operations)
    summary.completed = sum(1 for op in ops if op.outcome is Outcome.COMPLETED)
    summary.expired = sum(1 for op in ops if op.outcome is Outcome.EXPIRED)
    summary.lost = sum(1 for op in ops if op.number not in report.finishes)
    summary.double_finished = sum(1 for count in report.finishes.values() if count > 1)
    console.print(
        f"[bold]{summary.completed} completed by key events, {summary.expired} expired, "
        f"{summary.lost} lost, {summary.double_finished} finished twice."
    )
    return summary
