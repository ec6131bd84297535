"""Typed errors raised by the purgatory (docs/design.md §3.4)."""

from __future__ import annotations

__all__ = ["InvalidOperationError", "PurgatoryClosedError", "PurgatoryError", "PurgatoryFullError"]


class PurgatoryError(Exception):
    """Base of every error the purgatory raises on its own behalf."""


class PurgatoryFullError(PurgatoryError):
    """``max_pending`` operations are already timed: the new one was neither watched nor timed."""

    def __init__(self, name: str, pending: int, max_pending: int) -> None:
        super().__init__(
            f"purgatory {name!r} is full: {pending} delayed operations pending, max_pending={max_pending}; "
            "the operation was not watched"
        )
        self.name = name
        self.pending = pending
        self.max_pending = max_pending


class PurgatoryClosedError(PurgatoryError):
    """The purgatory (or timer) has been shut down and takes no new operations."""

    def __init__(self, name: str) -> None:
        super().__init__(f"purgatory {name!r} has been shut down; no new operations are accepted")
        self.name = name


class InvalidOperationError(PurgatoryError, ValueError):
    """The operation cannot be submitted in its current state (for example already completed)."""
