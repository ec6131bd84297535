"""Measuring helpers shared by the benchmarks: GC activity, process CPU, percentiles."""

from __future__ import annotations

import gc
import time
from types import TracebackType
from typing import Any

__all__ = ["GcMeter", "percentile"]


class GcMeter:
    """Counts cyclic-GC collections per generation, and the time they took, inside a ``with``.

    Kafka's TestPurgatoryPerformance reports the JVM collectors' counts and times; this is
    CPython's equivalent (``gc.callbacks``), so GC's share of a run is visible next to its time.
    """

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.counts[int(info["generation"])] += 1

    def reset(self) -> None:
        """Forget what was counted so far (a run's own start-up collection is not its GC)."""
        self.counts = [0, 0, 0]
        self.seconds = 0.0

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self._callback)

    def as_dict(self) -> dict[str, Any]:
        return {"gc_counts": list(self.counts), "gc_ms": round(self.seconds * 1000.0, 3)}


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest-rank; NaN when empty."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]
