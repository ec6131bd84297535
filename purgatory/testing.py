"""Deterministic time for tests — ours and our users': ``MockTime`` and ``MockTimer`` — and what a
leak check must know of the core: ``pooled_watch_entries``."""

from __future__ import annotations

import threading

from mypy_extensions import mypyc_attr

from ._watchers import pooled_watch_entries
from .timer import TimerTask, WheelTimerCore, leave_bucket

__all__ = ["MockTime", "MockTimer", "pooled_watch_entries"]


@mypyc_attr(allow_interpreted_subclasses=True)
class MockTime:
    """A clock that moves only when told to. Thread-safe."""

    __slots__ = ("_lock", "_now_ms")

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = start_ms
        self._lock = threading.Lock()

    def milliseconds(self) -> int:
        return self._now_ms

    def nanoseconds(self) -> int:
        return self._now_ms * 1_000_000

    def sleep(self, ms: int) -> None:
        """Move the clock forward by ``ms`` (returns at once)."""
        if ms < 0:
            raise ValueError(f"ms must be >= 0 to move a MockTime forward, got {ms!r}")
        with self._lock:
            self._now_ms += ms


@mypyc_attr(allow_interpreted_subclasses=True)
class MockTimer:
    """A timer whose clock is a :class:`MockTime`: nothing runs until the test moves time.

    The same timing wheel as :class:`~purgatory.SystemTimer` (tick 1 ms, so deadlines are exact),
    without an executor thread: :meth:`advance_clock` moves the mock time forward by ``ms`` and
    runs, on the caller's thread and in expiration order, every task due at or before the new
    time (Kafka's MockTimer needs time strictly past the deadline; "due at" is the clearer rule).
    A task added with ``delay_ms <= 0`` runs at once on the adding thread. Tasks never run while
    the timer's lock is held, so a task may add tasks or re-enter a purgatory.
    """

    def __init__(self, time: MockTime | None = None) -> None:
        self.time = time if time is not None else MockTime()
        self._core = WheelTimerCore(1, 20, self.time.milliseconds(), self.time.milliseconds)
        self._closed = False

    def add(self, timer_task: TimerTask) -> None:
        if timer_task.delay_ms <= 0:
            # Kafka's MockTimer: no delay, no wheel. (The wheel's clock may lag the mock time.)
            if timer_task._bucket is not None:
                leave_bucket(timer_task)  # a task is in at most one place: it runs now instead
            timer_task.run()
            return
        if not self._core.schedule(timer_task) and timer_task._scheduled:
            timer_task.run()

    def advance_clock(self, ms: int) -> bool:
        """Move time forward by ``ms`` and run every task now due; True if any bucket was due."""
        self.time.sleep(ms)
        now = self.time.milliseconds()
        processed = False
        while True:
            due: list[TimerTask] = []
            if not self._core.flush_due(now, due.append):
                # Nothing is due at or before ``now``: bring the wheel's clock up to it, so a
                # task added next with a 1 ms delay lands in the bucket for now + 1.
                self._core.advance_wheel(now)
                return processed
            processed = True
            for task in due:
                task.run()

    def size(self) -> int:
        return self._core.size()

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"MockTimer(now_ms={self.time.milliseconds()}, size={self.size()})"
