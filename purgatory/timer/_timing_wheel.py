"""TimingWheel: one level of Kafka's hierarchical timing wheel."""

from __future__ import annotations

from typing import Protocol

from ._task import TimerTask, TimerTaskEntry, leave_bucket
from ._task_list import TaskCounter, TimerTaskList

__all__ = ["MAX_WHEEL_SIZE", "BucketQueue", "TimingWheel", "bucket_expiration", "bucket_index", "wheel_start"]

# Buckets are allocated up front, on every level: 4,096 per level is ~1.4 MB and already 200x
# Kafka's 20 (each level covers wheel_size times the one below, so more buckets buy little).
# Without a bound, a mistyped wheel_size (say 2**40) allocated until the kernel killed the process.
MAX_WHEEL_SIZE = 4096


class BucketQueue(Protocol):
    """Where a wheel announces a bucket whose expiration changed (the timer's delay queue)."""

    def offer(self, bucket: TimerTaskList) -> None: ...


# Slot arithmetic as pure functions (tested exhaustively at the boundaries in test_timing_wheel).


def wheel_start(start_ms: int, tick_ms: int) -> int:
    """A wheel's current time is always a multiple of its tick."""
    return start_ms - start_ms % tick_ms


def bucket_index(expiration_ms: int, tick_ms: int, wheel_size: int) -> int:
    """The slot holding ``expiration_ms``: slots are reused every ``tick_ms * wheel_size`` ms."""
    return (expiration_ms // tick_ms) % wheel_size


def bucket_expiration(expiration_ms: int, tick_ms: int) -> int:
    """The start of the tick containing ``expiration_ms``: when that bucket becomes due."""
    return (expiration_ms // tick_ms) * tick_ms


class TimingWheel:
    """A simple timing wheel with on-demand overflow wheels, as in Kafka's ``TimingWheel``.

    A wheel has ``wheel_size`` buckets of ``tick_ms`` each, so it spans ``interval = tick_ms *
    wheel_size``. An entry due before ``current_time + tick_ms`` is already expired (``add``
    returns False and the caller runs it); one due within ``interval`` goes to bucket
    ``(expiration // tick_ms) % wheel_size``; anything later is delegated to the overflow wheel,
    whose tick is this wheel's interval. As the clock advances, an overflow bucket comes due and
    its entries are flushed and re-added, landing in a finer wheel (or running).

    Example (tick 1 ms, size 20, start 0): a 5 ms entry goes to bucket 5 of level 0; a 90 ms
    entry goes to level 1 (tick 20, interval 400), bucket (90 // 20) % 20 = 4 whose expiration
    is 80. At time 80 that bucket is flushed: 90 < 80 + 20, so the entry is re-added to level 0,
    bucket 90 % 20 = 10 (expiration 90), and runs when the clock reaches 90.

    Buckets — not entries — go to the delay queue, and only when a bucket's expiration changes,
    so the clock jumps straight to the next non-empty bucket instead of ticking through empty ones.

    ``add`` takes the timer's lock (the task counter's, shared with every bucket) and
    ``_add_task`` expects it held; ``advance_clock`` is not thread-safe: the owning timer
    serialises it with adds (Kafka: "There should not be any add calls while advanceClock is
    executing"). Tasks may be cancelled concurrently from any thread.
    """

    __slots__ = (
        "_buckets",
        "_lock",
        "_overflow_wheel",
        "_queue",
        "_task_counter",
        "current_time_ms",
        "interval",
        "start_ms",
        "tick_ms",
        "wheel_size",
    )

    def __init__(
        self,
        tick_ms: int,
        wheel_size: int,
        start_ms: int,
        task_counter: TaskCounter,
        queue: BucketQueue,
    ) -> None:
        if tick_ms <= 0:
            raise ValueError(f"tick_ms must be a positive number of milliseconds, got {tick_ms!r}")
        if not 0 < wheel_size <= MAX_WHEEL_SIZE:
            raise ValueError(
                f"wheel_size must be a number of buckets from 1 to {MAX_WHEEL_SIZE}, got {wheel_size!r}"
            )
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.start_ms = start_ms
        self.interval = tick_ms * wheel_size
        self.current_time_ms = wheel_start(start_ms, tick_ms)
        self._task_counter = task_counter
        self._lock = task_counter.lock  # shared with every bucket (see TaskCounter)
        self._queue = queue
        self._buckets = [TimerTaskList(task_counter) for _ in range(wheel_size)]
        self._overflow_wheel: TimingWheel | None = None

    @property
    def overflow_wheel(self) -> TimingWheel | None:
        return self._overflow_wheel

    def _add_overflow_wheel(self) -> TimingWheel:
        wheel = self._overflow_wheel
        if wheel is None:
            wheel = TimingWheel(
                self.interval, self.wheel_size, self.current_time_ms, self._task_counter, self._queue
            )
            self._overflow_wheel = wheel
        return wheel

    def add(self, entry: TimerTaskEntry) -> bool:
        """Place ``entry``; False when it is cancelled or already expired (the caller runs it)."""
        task = entry.timer_task
        while task._entry is entry:
            # Leave any other bucket outside our lock (it may be another timer's).
            leave_bucket(task)
            with self._lock:
                if task._bucket is None and task._entry is entry:
                    return self._add_task(task, entry.expiration_ms)
        return False

    def _add_task(self, task: TimerTask, expiration: int) -> bool:
        """Place ``task`` due at ``expiration``; False if already expired. Caller holds the lock
        and the task is in no bucket. (Iterative rather than Kafka's recursion: same decisions.)"""
        wheel = self
        while True:
            current = wheel.current_time_ms
            tick = wheel.tick_ms
            if expiration < current + tick:
                return False
            if expiration < current + wheel.interval:
                virtual_id = expiration // tick
                bucket = wheel._buckets[virtual_id % wheel.wheel_size]
                task._expiration_ms = expiration
                bucket._link(task)
                # Queue the bucket only when its expiration changed: a bucket is queued once per
                # round, however many tasks it collects.
                bucket_expiration = virtual_id * tick
                if bucket._expiration_ms != bucket_expiration:
                    bucket._expiration_ms = bucket_expiration
                    wheel._queue.offer(bucket)
                return True
            overflow = wheel._overflow_wheel
            wheel = overflow if overflow is not None else wheel._add_overflow_wheel()

    def advance_clock(self, time_ms: int) -> None:
        """Move this wheel (and its overflow wheels) to the tick containing ``time_ms``."""
        wheel: TimingWheel | None = self
        while wheel is not None:
            if time_ms < wheel.current_time_ms + wheel.tick_ms:
                return
            wheel.current_time_ms = wheel_start(time_ms, wheel.tick_ms)
            time_ms = wheel.current_time_ms
            wheel = wheel._overflow_wheel
