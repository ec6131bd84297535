"""The wheel machinery shared by SystemTimer and MockTimer (and the Timer protocol, re-exported)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from ._delay_queue import DelayQueue
from ._protocol import Timer
from ._task import TimerTask, leave_bucket
from ._task_list import TaskCounter, TimerTaskList
from ._timing_wheel import TimingWheel

__all__ = ["Timer", "WheelTimerCore", "monotonic_ms"]


# Bound once (Final: a C static): compiled, ``time.monotonic_ns()`` looked ``monotonic_ns`` up on
# the module on every call, ~200 of the ~700 instructions each submission's clock read cost
# (callgrind, the bench's per-request work; docs/performance.md, issue 15).
_monotonic_ns: Final = time.monotonic_ns


def monotonic_ms() -> int:
    """Milliseconds of a clock that never goes back (wall-clock jumps must not fire timers)."""
    return _monotonic_ns() // 1_000_000


class WheelTimerCore:
    """A hierarchical timing wheel plus its delay queue of buckets and pending-task count.

    One lock (``lock``, the task counter's) serialises ``schedule``/``add``, ``flush_due`` and
    every bucket operation, cancellation included: under the GIL one lock costs one
    acquire/release per operation where Kafka's per-bucket locks plus an atomic counter would
    cost two or three, and buys the same (no) parallelism. Expired tasks are handed to
    ``dispatch``, which must not block or call back into the timer (it runs under the lock):
    SystemTimer queues them for its executor thread, MockTimer collects them to run on the
    caller's thread once the lock is released.
    """

    __slots__ = ("_acquire", "_monotonic", "_release", "clock", "lock", "queue", "task_counter", "wheel")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int, clock: Callable[[], int]) -> None:
        self.clock = clock
        # SystemTimer's clock is called directly (a native call) rather than through the field:
        # compiled, calling a function object goes through its Python-level wrapper (~870
        # instructions per add in callgrind, a tenth of a submission).
        self._monotonic = clock is monotonic_ms
        self.task_counter = TaskCounter()
        self.lock = self.task_counter.lock
        # Bound once: compiled, ``lock.acquire()`` looks the method up by name on every call.
        self._acquire = self.lock.acquire
        self._release = self.lock.release
        self.queue = DelayQueue(clock)
        self.wheel = TimingWheel(tick_ms, wheel_size, start_ms, self.task_counter, self.queue)

    def schedule(self, task: TimerTask) -> bool:
        """Place ``task`` due ``task.delay_ms`` from now; False when it is due already (the
        caller runs it unless it was cancelled meanwhile). Re-adding replaces its old place."""
        expiration = task.delay_ms + (monotonic_ms() if self._monotonic else self.clock())
        acquire = self._acquire
        release = self._release
        while True:
            if task._bucket is not None:
                # Leave the old bucket outside our lock: it may belong to another timer.
                leave_bucket(task)
            # acquire/release rather than ``with``: compiled, ``with`` also looks up and calls
            # ``__enter__``/``__exit__`` through the generic protocol on every add.
            acquire()
            try:
                if task._bucket is None:  # else a concurrent add of the same task won: retry
                    task._entry = None
                    task._scheduled = True
                    return self.wheel._add_task(task, expiration)
            finally:
                release()

    def add(self, task: TimerTask, dispatch: Callable[[TimerTask], None]) -> None:
        """Schedule ``task``; if it is due already, hand it to ``dispatch`` (on this thread)."""
        if not self.schedule(task) and task._scheduled:
            dispatch(task)

    def flush_due(
        self, now_ms: int, dispatch: Callable[[TimerTask], None], first: TimerTaskList | None = None
    ) -> bool:
        """Advance through every bucket due at ``now_ms`` (starting with ``first``, already taken
        from the queue), re-inserting each task in a finer wheel or dispatching it."""
        lock = self.lock
        queue = self.queue
        wheel = self.wheel
        lock.acquire()
        try:
            bucket = first if first is not None else queue.poll_due(now_ms)
            if bucket is None:
                return False
            while bucket is not None:
                wheel.advance_clock(bucket._expiration_ms)
                root = bucket._root
                task = bucket._detach_all()
                while task is not root:
                    nxt = task._next
                    assert nxt is not None, "a detached chain ends at the sentinel"
                    bucket._release(task)
                    # A task cancelled concurrently (its flag is set before it waits for our
                    # lock) is dropped here; its ``cancel`` then finds it in no bucket.
                    if task._scheduled and not wheel._add_task(task, task._expiration_ms):
                        dispatch(task)
                    task = nxt
                bucket = queue.poll_due(now_ms)
        finally:
            lock.release()
        return True

    def advance_wheel(self, now_ms: int) -> None:
        """Bring the wheel's clock up to ``now_ms`` when no bucket is due (MockTimer)."""
        lock = self.lock
        lock.acquire()
        try:
            self.wheel.advance_clock(now_ms)
        finally:
            lock.release()

    def size(self) -> int:
        return self.task_counter.value
