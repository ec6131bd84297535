"""The Timer protocol and the wheel machinery shared by SystemTimer and MockTimer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ._delay_queue import DelayQueue
from ._timer_task import TimerTask, TimerTaskEntry
from ._timer_task_list import TaskCounter, TimerTaskList
from ._timing_wheel import TimingWheel

__all__ = ["Timer", "WheelTimerCore"]


@runtime_checkable
class Timer(Protocol):
    """Kafka's ``Timer`` interface: what a purgatory needs from its timer."""

    def add(self, timer_task: TimerTask) -> None: ...

    def advance_clock(self, timeout_ms: int) -> bool: ...

    def size(self) -> int: ...

    def close(self) -> None: ...


class WheelTimerCore:
    """A hierarchical timing wheel plus its delay queue of buckets and pending-task count.

    ``add`` and ``flush_due`` are serialised by ``lock`` (the wheel is not thread-safe);
    cancellation needs no timer lock (buckets lock themselves). Expired tasks are handed to
    ``dispatch``, which must not block: SystemTimer queues them for its executor thread, MockTimer
    collects them to run on the caller's thread once the lock is released.
    """

    __slots__ = ("clock", "lock", "queue", "task_counter", "wheel")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.task_counter = TaskCounter()
        self.queue = DelayQueue(clock)
        self.wheel = TimingWheel(tick_ms, wheel_size, start_ms, self.task_counter, self.queue)

    def add(self, task: TimerTask, dispatch: Callable[[TimerTask], None]) -> None:
        entry = TimerTaskEntry(task, task.delay_ms + self.clock())
        with self.lock:
            self._add_entry(entry, dispatch)

    def _add_entry(self, entry: TimerTaskEntry, dispatch: Callable[[TimerTask], None]) -> None:
        # Not placed: cancelled (drop it) or already expired (run it).
        if not self.wheel.add(entry) and not entry.cancelled():
            dispatch(entry.timer_task)

    def flush_due(
        self, now_ms: int, dispatch: Callable[[TimerTask], None], first: TimerTaskList | None = None
    ) -> bool:
        """Advance through every bucket due at ``now_ms`` (starting with ``first``, already taken
        from the queue), re-inserting each entry in a finer wheel or dispatching it."""
        with self.lock:
            bucket = first if first is not None else self.queue.poll_due(now_ms)
            if bucket is None:
                return False
            while bucket is not None:
                self.wheel.advance_clock(bucket.get_expiration())
                bucket.flush(lambda entry: self._add_entry(entry, dispatch))
                bucket = self.queue.poll_due(now_ms)
        return True

    def size(self) -> int:
        return self.task_counter.value
