"""Counters every purgatory keeps, and the registry of live purgatories that exporters read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ._outcome import Outcome

if TYPE_CHECKING:
    from ._purgatory_core import PurgatoryCore

__all__ = [
    "LATENCY_BASE_NS",
    "LATENCY_BUCKETS",
    "OUTCOME_ROWS",
    "PurgatoryStats",
    "latency_bucket",
    "live_purgatories",
]

# The latency histogram (submission to finish, per outcome) is kept here as bucket counts, not
# as a prometheus Histogram: ``observe`` takes a lock and runs Python code per operation, and the
# finish counts it inside the claim, where no Python code may run (see _operation_core.finish).
# The collector turns the counts into a histogram at scrape time (purgatory/metrics.py).
LATENCY_BASE_NS: Final = 250_000  # the first bucket's bound, 0.25 ms; each next one doubles it
# Finite buckets 0.25 ms, 0.5 ms, ... 2**18 * 0.25 ms = 65.5 s (past the longest request
# timeouts in use: Kafka's request.timeout.ms is 30 s); index LATENCY_BUCKETS is +Inf.
LATENCY_BUCKETS: Final = 19
_ROW: Final = LATENCY_BUCKETS + 1  # counts per outcome: the finite buckets and +Inf
OUTCOME_ROWS: Final = ("completed", "expired", "cancelled")  # row order of the latency counts

# Bound once: compiled, a Final callable is one vectorcall, not a module attribute lookup.
_monotonic_ns: Final = time.monotonic_ns


def latency_bucket(latency_ns: int) -> int:
    """The bucket of ``latency_ns``: the smallest ``k`` with ``latency_ns < LATENCY_BASE_NS << k``,
    or ``LATENCY_BUCKETS`` (+Inf) past the last bound. Shifts, no float math and no search: it
    runs once per finished operation. (tests/core/test_metrics.py::test_latency_bucket_bounds)"""
    q = latency_ns // LATENCY_BASE_NS
    k = 0
    while q > 0 and k < LATENCY_BUCKETS:
        q >>= 1
        k += 1
    return k


class PurgatoryStats:
    """Finished operations by outcome, their latency, and user-code errors (docs/design.md §3.3).

    Latency is from submission (``try_complete_else_watch``, before the first try) to the
    claim of the finish, on ``clock`` (``time.monotonic_ns`` unless the purgatory runs on a
    MockTimer: then its mock time, so tests see exact latencies), counted per outcome in the
    buckets of :func:`latency_bucket` with the sum in ns.

    Finishes come from the executor, the reaper and any caller's thread at once, and ``+=`` on
    an attribute is not atomic across threads: outcome and latency counts are updated inside the
    operations' claim (see ``count``), error counts under this object's own lock.
    """

    __slots__ = (
        "_lock",
        "cancelled",
        "clock",
        "completed",
        "expired",
        "latency_counts",
        "latency_sum_ns",
        "user_code_errors",
    )

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self._lock = threading.Lock()
        self.completed = 0
        self.expired = 0
        self.cancelled = 0
        self.user_code_errors = 0
        # None: time.monotonic_ns (read through a Final, no Python frame); else a clock in ns.
        self.clock = clock
        # Row per outcome (OUTCOME_ROWS), LATENCY_BUCKETS + 1 counts each, not cumulative.
        self.latency_counts = [0] * (len(OUTCOME_ROWS) * _ROW)
        self.latency_sum_ns = [0] * len(OUTCOME_ROWS)

    def now_ns(self) -> int:
        """The latency clock (see the class docstring)."""
        clock = self.clock
        if clock is None:
            return _monotonic_ns()
        return clock()

    def count(self, outcome: Outcome, latency_ns: int) -> None:
        # Called by _operation_core.finish inside its claim (compiled: native steps no other
        # thread can interleave — list reads and stores of ints run no Python code; interpreted:
        # under the claim lock), which serialises every update of these counters: no lock of
        # our own on the completion path.
        if outcome is Outcome.COMPLETED:
            self.completed += 1
            row = 0
        elif outcome is Outcome.EXPIRED:
            self.expired += 1
            row = 1
        else:
            self.cancelled += 1
            row = 2
        if latency_ns < 0:
            latency_ns = 0  # a clock swapped under a pending operation: count it, as 0
        self.latency_counts[row * _ROW + latency_bucket(latency_ns)] += 1
        self.latency_sum_ns[row] += latency_ns

    def latency(self) -> dict[str, tuple[list[int], int]]:
        """Per outcome: the bucket counts (not cumulative; the last is +Inf) and the sum in ns."""
        counts = list(self.latency_counts)  # one C-level copy: a consistent row set
        sums = list(self.latency_sum_ns)
        return {
            name: (counts[row * _ROW : (row + 1) * _ROW], sums[row]) for row, name in enumerate(OUTCOME_ROWS)
        }

    def error(self) -> None:
        with self._lock:
            self.user_code_errors += 1

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {
                "completed": self.completed,
                "expired": self.expired,
                "cancelled": self.cancelled,
                "user_code_errors": self.user_code_errors,
            }


_registry_lock = threading.Lock()
_live: dict[int, PurgatoryCore[Any]] = {}


def register(purgatory: PurgatoryCore[Any]) -> None:
    with _registry_lock:
        _live[id(purgatory)] = purgatory


def unregister(purgatory: PurgatoryCore[Any]) -> None:
    with _registry_lock:
        _live.pop(id(purgatory), None)


def live_purgatories() -> list[PurgatoryCore[Any]]:
    """Purgatories constructed and not yet shut down (metrics are registered for exactly these)."""
    with _registry_lock:
        return list(_live.values())
