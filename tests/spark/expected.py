"""Exact answers computed in plain Python from the events a test writes: the oracle."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from purgatory.journal import EventType, JournalEvent

WINDOW_MS = 60_000


@dataclass
class WindowAnswer:
    counts: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # completed only


def window_of(ts_ms: int) -> int:
    return ts_ms - ts_ms % WINDOW_MS


def answers(events: Iterable[JournalEvent]) -> dict[tuple[int, str], WindowAnswer]:
    """Per (window start ms, op_type): counts by event type and the completed latencies."""
    unique = {event.event_id: event for event in events}
    result: dict[tuple[int, str], WindowAnswer] = defaultdict(WindowAnswer)
    for event in unique.values():
        cell = result[(window_of(event.ts_ms), event.op_type)]
        cell.counts[event.event_type.value] += 1
        if event.event_type is EventType.COMPLETED:
            assert event.latency_ms is not None
            cell.latencies.append(event.latency_ms)
    return dict(result)


def key_answers(events: Iterable[JournalEvent]) -> Counter[tuple[int, str, str]]:
    """Operations created per (window start ms, op_type, key)."""
    unique = {event.event_id: event for event in events}
    counts: Counter[tuple[int, str, str]] = Counter()
    for event in unique.values():
        if event.event_type is EventType.CREATED:
            for key in event.keys:
                counts[(window_of(event.ts_ms), event.op_type, key)] += 1
    return counts


def percentile_band(values: list[float], p: float, accuracy: int) -> tuple[float, float]:
    """The values percentile_approx may return: within n/accuracy ranks of the exact percentile.

    Exact percentile (Spark's definition): the smallest value v with at least p*n values <= v,
    i.e. sorted[ceil(p*n) - 1]. The documented error moves the rank by at most n/accuracy.
    """
    ordered = sorted(values)
    n = len(ordered)
    rank = max(0, math.ceil(p * n) - 1)
    slack = math.ceil(n / accuracy)
    return ordered[max(0, rank - slack)], ordered[min(n - 1, rank + slack)]
