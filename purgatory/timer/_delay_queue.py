"""DelayQueue: the timer's queue of buckets, ordered by expiration (Kafka uses java's DelayQueue)."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable

from ._task_list import TimerTaskList

__all__ = ["DelayQueue"]


class DelayQueue:
    """Buckets keyed by the expiration they had when offered; ``poll`` hands out due ones.

    A bucket's expiration changes only after it has been flushed (reset to -1) and re-filled,
    and then it is offered again under its new expiration. A heap item whose recorded
    expiration no longer matches its bucket is therefore stale and is skipped.
    Thread-safe; ``poll`` blocks (up to its timeout) until the head bucket is due.
    """

    __slots__ = ("_clock", "_cond", "_heap", "_seq", "_woken")

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        # Items are tuples ``(expiration, seq, bucket)`` so ordering compares ints in C; ``seq``
        # breaks ties so buckets themselves are never compared.
        self._heap: list[tuple[int, int, TimerTaskList]] = []
        self._seq = 0
        self._woken = False

    def offer(self, bucket: TimerTaskList) -> None:
        expiration = bucket.get_expiration()
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (expiration, self._seq, bucket))
            # Wake a waiting poller only when the new bucket is the earliest: it must re-arm its wait.
            if self._heap[0][2] is bucket:
                self._cond.notify_all()

    def wakeup(self) -> None:
        """Make a blocked ``poll`` return (None if nothing is due) now rather than at its timeout."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def poll_due(self, now_ms: int) -> TimerTaskList | None:
        """The earliest bucket due at ``now_ms``, or None; never blocks."""
        with self._cond:
            return self._pop_due(now_ms)

    def _pop_due(self, now_ms: int) -> TimerTaskList | None:
        heap = self._heap
        while heap:
            expiration, _, bucket = heap[0]
            if expiration > now_ms:
                return None
            heapq.heappop(heap)
            if bucket._expiration_ms == expiration:
                return bucket
            # stale: the bucket was flushed and has been re-offered under another expiration
        return None

    def poll(self, timeout_ms: int) -> TimerTaskList | None:
        """Wait up to ``timeout_ms`` for a due bucket; None on timeout or :meth:`wakeup`."""
        clock = self._clock
        deadline = clock() + timeout_ms
        with self._cond:
            while True:
                now = clock()
                bucket = self._pop_due(now)
                if bucket is not None:
                    return bucket
                if self._woken:
                    self._woken = False
                    return None
                wait_ms = deadline - now
                if wait_ms <= 0:
                    return None
                if self._heap:
                    wait_ms = min(wait_ms, self._heap[0][0] - now)
                # +1 ms: the clock is truncated to whole milliseconds, so waking exactly at the
                # head's expiration could read one millisecond early and spin.
                self._cond.wait((wait_ms + 1) / 1000.0)

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)
