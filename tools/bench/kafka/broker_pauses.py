"""When the benchmark's own broker stopped: its JVM's safepoints, read from the JVM's own log.

Why this lives here: ``purgatory bench kafka`` found its completion-lag tail to be the local
broker's stop-the-world pauses (docs/performance.md, "Change-feed completion lag"). A record
produced while the broker is stopped is appended, acknowledged and fetched only after the pause,
by every client alike; so the bench reports, next to the lags, how long the broker stood still in
the measured window and how many of the slowest records had a pause while they were in flight.
Only for a cluster the bench started: an existing cluster's JVM is not ours to log.

The JVM writes one line per safepoint (``-Xlog:safepoint:file=<path>:timenanos``)::

    [61088305047996ns] Safepoint "GenCollectForAllocation", Time since last: 400478632 ns,
        Reaching safepoint: 174169 ns, Cleanup: 7482 ns, At safepoint: 9679018 ns, Total: 9860669 ns

``timenanos`` is ``System.nanoTime()`` at the end of the safepoint: CLOCK_MONOTONIC on Linux, the
clock of Python's ``time.monotonic_ns()``, so the pause ``[end - total, end]`` lines up with the
bench's own timestamps without any offset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BrokerPause",
    "Collection",
    "PauseSummary",
    "gc_log_option",
    "read_collections",
    "read_pauses",
    "safepoint_log_option",
    "summarize",
]

_SAFEPOINT = re.compile(r'^\[(?P<end>\d+)ns\].*Safepoint "(?P<cause>[^"]+)".*Total: (?P<total>\d+) ns')


def safepoint_log_option(path: Path) -> str:
    """The JVM option that logs every safepoint with its end on the monotonic clock."""
    return f"-Xlog:safepoint:file={path}:timenanos"


_GC_PAUSE = re.compile(
    r"^\[[^\]]*\]\[(?P<end>\d+)ns\] GC\((?P<id>\d+)\) Pause (?P<kind>Young|Full) \((?P<cause>[^)]*)\)"
    r".* (?P<ms>[\d.]+)ms$"
)
_GC_AGE = re.compile(r"GC\((?P<id>\d+)\) - age +\d+: +\d+ bytes, +(?P<total>\d+) total")
_GC_CPU = re.compile(r"GC\((?P<id>\d+)\) User=(?P<user>[\d.]+)s Sys=(?P<sys>[\d.]+)s Real=(?P<real>[\d.]+)s")


def gc_log_option(path: Path) -> str:
    """The JVM option that logs each collection (cause, heap before -> after, pause), the
    survivors' ages (``gc+age=trace``: the bytes copied at each age, what a young pause costs)
    and its CPU against wall time (``gc+cpu``: a pause longer than its CPU waited for a core),
    stamped on the same monotonic clock as the safepoint log."""
    return f"-Xlog:gc,gc+age=trace,gc+cpu:file={path}:uptime,timenanos"


@dataclass(frozen=True, slots=True)
class Collection:
    """One collection from the GC log (``gc_log_option``)."""

    end_ns: int  # the monotonic clock, as the safepoint log's
    kind: str  # Young or Full
    cause: str  # Allocation Failure, Metadata GC Threshold, ...
    pause_ms: float
    survived_bytes: int  # a young collection's survivors copied within the young generation
    cpu_ms: float  # User + Sys of the collector's threads (0.0 when not logged)


def read_collections(text: str) -> list[Collection]:
    """Every collection in a ``gc_log_option`` file's text, in order; other lines are skipped.
    A young collection's survivors are the ``total`` of its last age line (none: 0)."""
    survived: dict[int, int] = {}
    cpu: dict[int, float] = {}
    pauses: list[tuple[int, re.Match[str]]] = []
    for line in text.splitlines():
        if (age := _GC_AGE.search(line)) is not None:
            survived[int(age["id"])] = int(age["total"])
        elif (pause := _GC_PAUSE.match(line)) is not None:
            pauses.append((int(pause["id"]), pause))
        elif (used := _GC_CPU.search(line)) is not None:
            cpu[int(used["id"])] = (float(used["user"]) + float(used["sys"])) * 1000.0
    return [
        Collection(
            int(p["end"]), p["kind"], p["cause"], float(p["ms"]), survived.get(gc_id, 0), cpu.get(gc_id, 0.0)
        )
        for gc_id, p in pauses
    ]


@dataclass(frozen=True, slots=True)
class BrokerPause:
    start_ns: int
    end_ns: int
    cause: str  # the VM operation: GenCollectForAllocation (a young GC), G1CollectForAllocation, ...

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def read_pauses(text: str) -> list[BrokerPause]:
    """Every safepoint in a ``-Xlog:safepoint`` file's text, in order; other lines are skipped."""
    pauses = []
    for line in text.splitlines():
        match = _SAFEPOINT.match(line)
        if match is not None:
            end = int(match["end"])
            pauses.append(BrokerPause(end - int(match["total"]), end, match["cause"]))
    return pauses


@dataclass(frozen=True, slots=True)
class PauseSummary:
    count: int  # pauses of at least ``min_ms`` ending inside the window
    total_ms: float
    max_ms: float
    slow_hit: int  # of the ``slow`` records, those in flight (produce() to completion) during a pause
    slow: int
    # (cause, count, total ms) of the same pauses, longest total first: a collection
    # (GenCollectForAllocation, G1CollectForAllocation, ...) or another VM operation (Cleanup,
    # ICBufferFull, Deoptimize, ...), which the JVM's flags remove rather than the heap's sizing.
    by_cause: tuple[tuple[str, int, float], ...] = ()

    def describe_causes(self) -> str:
        return (
            ", ".join(f"{cause} {count}x {total:.0f} ms" for cause, count, total in self.by_cause) or "none"
        )


def summarize(
    pauses: list[BrokerPause],
    window: tuple[int, int],
    slow: list[tuple[int, int]],
    min_ms: float = 1.0,
) -> PauseSummary:
    """The broker's pauses of ``min_ms`` or more in ``window`` (monotonic ns), and how many of the
    ``slow`` records (``(sent_ns, completed_ns)``) had one while in flight: a record sent before
    the pause but not yet appended, acknowledged or fetched when it began waits for its end."""
    start, end = window
    inside = [p for p in pauses if start <= p.end_ns and p.start_ns < end and p.ms >= min_ms]
    hit = sum(1 for sent, done in slow if any(p.start_ns < done and sent < p.end_ns for p in inside))
    causes: dict[str, tuple[int, float]] = {}
    for p in inside:
        count, total = causes.get(p.cause, (0, 0.0))
        causes[p.cause] = (count + 1, total + p.ms)
    return PauseSummary(
        count=len(inside),
        total_ms=sum(p.ms for p in inside),
        max_ms=max((p.ms for p in inside), default=0.0),
        slow_hit=hit,
        slow=len(slow),
        by_cause=tuple(
            sorted(((cause, n, ms) for cause, (n, ms) in causes.items()), key=lambda item: -item[2])
        ),
    )
