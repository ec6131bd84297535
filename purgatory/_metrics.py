"""Counters every purgatory keeps, and the registry of live purgatories that exporters read."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ._outcome import Outcome

if TYPE_CHECKING:
    from ._purgatory_core import PurgatoryCore

__all__ = ["PurgatoryStats", "live_purgatories"]


class PurgatoryStats:
    """Finished operations by outcome, and user-code errors (docs/design.md §3.3 metrics).

    Finishes come from the executor, the reaper and any caller's thread at once, and ``+=`` on
    an attribute is not atomic across threads: outcome counts are updated inside the operations'
    claim (see ``count``), error counts under this object's own lock.
    """

    __slots__ = ("_lock", "cancelled", "completed", "expired", "user_code_errors")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.completed = 0
        self.expired = 0
        self.cancelled = 0
        self.user_code_errors = 0

    def count(self, outcome: Outcome) -> None:
        # Called by _operation_core.finish inside its claim (compiled: native steps no other
        # thread can interleave; interpreted: under the claim lock), which serialises every
        # update of these three counters: no lock of our own on the completion path.
        if outcome is Outcome.COMPLETED:
            self.completed += 1
        elif outcome is Outcome.EXPIRED:
            self.expired += 1
        else:
            self.cancelled += 1

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
