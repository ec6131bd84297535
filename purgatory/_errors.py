"""Typed errors raised by the purgatory (docs/design.md §3.4)."""

from __future__ import annotations

__all__ = ["InvalidOperationError", "PurgatoryClosedError", "PurgatoryError", "PurgatoryFullError"]


class PurgatoryError(Exception):
    """Base of every error the purgatory raises on its own behalf."""


class PurgatoryFullError(PurgatoryError):
    """A waiter limit is reached: the new operation was neither watched nor timed.

    ``key`` is None when ``max_pending`` operations are already timed (the whole purgatory, or
    the whole process for a caller enforcing a process-wide limit), else the watch key that
    already has ``max_pending`` (= ``max_pending_per_key``) operations watching it.
    """

    def __init__(self, name: str, pending: int, max_pending: int, key: object = None) -> None:
        if key is None:
            what = f"{pending} delayed operations pending, max_pending={max_pending}"
        else:
            what = f"{pending} operations watch key {key!r}, max_pending_per_key={max_pending}"
        super().__init__(f"purgatory {name!r} is full: {what}; the operation was not watched")
        self.name = name
        self.pending = pending
        self.max_pending = max_pending
        self.key = key


class PurgatoryClosedError(PurgatoryError):
    """The purgatory (or timer) has been shut down and takes no new operations."""

    def __init__(self, name: str) -> None:
        super().__init__(f"purgatory {name!r} has been shut down; no new operations are accepted")
        self.name = name


class InvalidOperationError(PurgatoryError, ValueError):
    """The operation cannot be submitted in its current state (for example already completed)."""
