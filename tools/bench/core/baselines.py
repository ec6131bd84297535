"""What Python users have today: heap timers with lazy cancellation, and a naive purgatory.

These are the baselines ``purgatory bench`` measures the project against, written as a careful
Python programmer would write them (the fastest plain-Python forms, docs/performance.md):

* :class:`HeapTimer` — "heap_tuple": ``heapq`` of list entries ``[when, seq, task]`` so every
  comparison stays in C; cancel clears the entry's task slot (lazy cancellation) and the heap
  is rebuilt when more than half of it is cancelled (asyncio's rule, ``base_events.py``).
  Thread-safe with one lock.
* :class:`AsyncioHeapTimer` — the same with asyncio-style ``TimerHandle`` objects ordered by a
  Python ``__lt__``, as asyncio, Tornado and Twisted keep them.
* :class:`ThreadedHeapTimer` — a :class:`HeapTimer` with its own thread that runs due tasks
  (real time), for the end-to-end and expiry-lateness benchmarks.
* :class:`NaivePurgatory` — one lock, a dict of lists per key, a :class:`ThreadedHeapTimer`.

All timers take a task object with ``delay_ms`` and ``run()``, and return a handle from
``add`` that ``cancel`` takes.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Hashable, Iterable
from typing import Any, Protocol

__all__ = [
    "AsyncioHeapTimer",
    "BaselineTask",
    "HeapTimer",
    "NaiveOperation",
    "NaivePurgatory",
    "ThreadedHeapTimer",
]

# asyncio's compaction rule (base_events.py): rebuild the heap once more than half of it is
# cancelled, and not before 100 cancelled entries have piled up.
MIN_CANCELLED_FOR_CLEANUP = 100
CANCELLED_FRACTION_FOR_CLEANUP = 0.5


class BaselineTask(Protocol):
    delay_ms: int

    def run(self) -> None: ...


class _HeapState(Protocol):
    _heap: list[list[Any]]
    _cancelled: int


class _LazyCancelHeap:
    """Lazy cancellation with asyncio's compaction rule, for heaps of ``[when, seq, task]``."""

    __slots__ = ()

    def _cancel_locked(self: _HeapState, entry: list[Any]) -> None:
        # Caller holds the heap's lock.
        if entry[2] is None:
            return  # already cancelled or already run
        entry[2] = None
        self._cancelled += 1
        if (
            self._cancelled > MIN_CANCELLED_FOR_CLEANUP
            and self._cancelled > CANCELLED_FRACTION_FOR_CLEANUP * len(self._heap)
        ):
            self._heap = [e for e in self._heap if e[2] is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def _pop_due_locked(self: _HeapState, now: float, due: list[BaselineTask]) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            task = entry[2]
            if task is None:
                self._cancelled -= 1
            else:
                entry[2] = None  # a later cancel() of a run task is a no-op
                due.append(task)


class HeapTimer(_LazyCancelHeap):
    """heapq timer with lazy cancellation; entries ``[when_ms, seq, task]`` (task None = cancelled)."""

    __slots__ = ("_cancelled", "_heap", "_lock", "_seq", "now_ms")

    def __init__(self, start_ms: int = 0) -> None:
        self._heap: list[list[Any]] = []
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._cancelled = 0
        self.now_ms = start_ms

    def add(self, task: BaselineTask) -> list[Any]:
        entry = [self.now_ms + task.delay_ms, next(self._seq), task]
        with self._lock:
            heapq.heappush(self._heap, entry)
        return entry

    def cancel(self, entry: list[Any]) -> None:
        with self._lock:
            self._cancel_locked(entry)

    def pop_due(self, now_ms: int) -> list[BaselineTask]:
        """Remove and return the live tasks due at ``now_ms`` (in order)."""
        due: list[BaselineTask] = []
        with self._lock:
            self._pop_due_locked(now_ms, due)
        return due

    def advance_clock(self, ms: int) -> None:
        """Simulated clock: move time by ``ms`` and run what is due (on this thread)."""
        self.now_ms += ms
        for task in self.pop_due(self.now_ms):
            task.run()

    def size(self) -> int:
        """Live entries (a heap cannot tell without counting: len minus cancelled)."""
        return len(self._heap) - self._cancelled

    def head_ms(self) -> int | None:
        with self._lock:
            return self._heap[0][0] if self._heap else None


class TimerHandle:
    """asyncio's ``TimerHandle`` shape: ordered by ``when`` through Python-level ``__lt__``."""

    __slots__ = ("_cancelled", "_scheduled", "task", "when")

    def __init__(self, when: int, task: BaselineTask) -> None:
        self.when = when
        self.task = task
        self._cancelled = False
        self._scheduled = True

    def __lt__(self, other: TimerHandle) -> bool:
        return self.when < other.when

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


class AsyncioHeapTimer:
    """A heap of ``TimerHandle`` objects with asyncio's lazy cancellation and compaction rule."""

    __slots__ = ("_cancelled", "_heap", "_lock", "now_ms")

    def __init__(self, start_ms: int = 0) -> None:
        self._heap: list[TimerHandle] = []
        self._lock = threading.Lock()
        self._cancelled = 0
        self.now_ms = start_ms

    def add(self, task: BaselineTask) -> TimerHandle:
        handle = TimerHandle(self.now_ms + task.delay_ms, task)
        with self._lock:
            heapq.heappush(self._heap, handle)
        return handle

    def cancel(self, handle: TimerHandle) -> None:
        with self._lock:
            if handle._cancelled or not handle._scheduled:
                return
            handle._cancelled = True
            self._cancelled += 1
            if (
                self._cancelled > MIN_CANCELLED_FOR_CLEANUP
                and self._cancelled > CANCELLED_FRACTION_FOR_CLEANUP * len(self._heap)
            ):
                new_heap = []
                for h in self._heap:
                    if h._cancelled:
                        h._scheduled = False
                    else:
                        new_heap.append(h)
                heapq.heapify(new_heap)
                self._heap = new_heap
                self._cancelled = 0

    def advance_clock(self, ms: int) -> None:
        self.now_ms += ms
        now = self.now_ms
        due: list[BaselineTask] = []
        with self._lock:
            heap = self._heap
            while heap and heap[0].when <= now:
                handle = heapq.heappop(heap)
                handle._scheduled = False
                if handle._cancelled:
                    self._cancelled -= 1
                else:
                    due.append(handle.task)
        for task in due:
            task.run()

    def size(self) -> int:
        return len(self._heap) - self._cancelled


class ThreadedHeapTimer(_LazyCancelHeap):
    """heap_tuple driven by real time: one lock, and a thread that sleeps until the head is due
    and runs due tasks itself (no executor hop: the simplest design, favourable to the
    baseline). Deadlines are float milliseconds of ``time.monotonic()``, exact."""

    __slots__ = ("__weakref__", "_cancelled", "_closed", "_cond", "_heap", "_seq", "_thread")

    def __init__(self, name: str = "heap-timer") -> None:
        self._heap: list[list[Any]] = []
        self._cond = threading.Condition(threading.Lock())
        self._seq = itertools.count()
        self._cancelled = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def add(self, task: BaselineTask) -> list[Any]:
        entry = [time.monotonic() * 1000.0 + task.delay_ms, next(self._seq), task]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cond.notify()  # a new earliest deadline: re-arm the sleeping thread
        return entry

    def cancel(self, entry: list[Any]) -> None:
        with self._cond:
            self._cancel_locked(entry)

    def size(self) -> int:
        return len(self._heap) - self._cancelled

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _loop(self) -> None:
        cond = self._cond
        while True:
            due: list[BaselineTask] = []
            with cond:
                while not self._closed:
                    now = time.monotonic() * 1000.0
                    self._pop_due_locked(now, due)
                    if due:
                        break
                    cond.wait((self._heap[0][0] - now) / 1000.0 if self._heap else None)
                if self._closed:
                    return
            for task in due:
                with contextlib.suppress(Exception):  # a task's failure must not stop the timer
                    task.run()


class NaiveOperation:
    """A delayed operation for :class:`NaivePurgatory`: the same contract as DelayedOperation
    (``try_complete``, ``force_complete`` claimed once, ``on_complete``, ``on_expiration``)."""

    __slots__ = ("_claim", "_entry", "_timer", "delay_ms")

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self._claim = threading.Lock()
        self._entry: list[Any] | None = None
        self._timer: ThreadedHeapTimer | None = None

    def try_complete(self) -> bool:
        raise NotImplementedError

    def on_complete(self) -> None:
        raise NotImplementedError

    def on_expiration(self) -> None:
        pass

    def is_completed(self) -> bool:
        return self._claim.locked()

    def force_complete(self) -> bool:
        if not self._claim.acquire(blocking=False):
            return False
        if self._entry is not None and self._timer is not None:
            self._timer.cancel(self._entry)
        self.on_complete()
        return True

    def run(self) -> None:  # expiry
        if self._claim.acquire(blocking=False):
            self.on_complete()
            self.on_expiration()


class NaivePurgatory:
    """One lock, a dict of lists per key, a heapq timer thread; purges finished ops from the
    lists every ``purge_interval`` submissions (Kafka's rule, or the lists grow without bound)."""

    def __init__(self, purge_interval: int = 1000) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[Hashable, list[NaiveOperation]] = {}
        self._timer = ThreadedHeapTimer("naive-purgatory-timer")
        self._purge_interval = purge_interval
        self._since_purge = 0

    def try_complete_else_watch(self, op: NaiveOperation, keys: Iterable[Hashable]) -> bool:
        if op.try_complete():
            return True
        with self._lock:
            for key in keys:
                ops = self._watchers.get(key)
                if ops is None:
                    self._watchers[key] = [op]
                else:
                    ops.append(op)
            self._since_purge += 1
            if self._since_purge >= self._purge_interval:
                self._since_purge = 0
                for key, ops in list(self._watchers.items()):
                    live = [o for o in ops if not o.is_completed()]
                    if live:
                        self._watchers[key] = live
                    else:
                        del self._watchers[key]
        if op.try_complete():
            return True
        op._timer = self._timer
        op._entry = self._timer.add(op)
        if op.is_completed():
            self._timer.cancel(op._entry)
        return False

    def check_and_complete(self, key: Hashable) -> int:
        with self._lock:
            ops = list(self._watchers.get(key, ()))
        completed = 0
        for op in ops:
            if not op.is_completed() and op.try_complete():
                completed += 1
        return completed

    def num_delayed(self) -> int:
        return self._timer.size()

    def shutdown(self) -> None:
        self._timer.close()
