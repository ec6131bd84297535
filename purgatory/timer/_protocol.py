"""The Timer protocol: what a purgatory needs from its timer.

Kept out of the compiled modules: mypyc does not compile ``runtime_checkable`` protocols.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._task import TimerTask

__all__ = ["Timer"]


@runtime_checkable
class Timer(Protocol):
    """Kafka's ``Timer`` interface: what a purgatory needs from its timer."""

    def add(self, timer_task: TimerTask) -> None: ...

    def advance_clock(self, timeout_ms: int) -> bool: ...

    def size(self) -> int: ...

    def close(self) -> None: ...
