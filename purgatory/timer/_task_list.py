"""TimerTaskList: one bucket of a timing wheel."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._task import TimerTask, TimerTaskEntry, _Sentinel, leave_bucket

__all__ = ["TaskCounter", "TimerTaskList"]


class TaskCounter:
    """The pending-task count shared by every bucket of one timer (Kafka's ``AtomicInteger``),
    and the one lock those buckets share.

    Kafka gives each bucket its own lock and the count an atomic. Under CPython's GIL separate
    locks buy no parallelism, and each costs an acquire/release pair per add and per cancel; so
    every bucket built on one counter locks ``counter.lock``, which also guards ``value``. The
    timer (``WheelTimerCore``) uses the same lock to serialise ``add`` with ``advance_clock``.
    """

    __slots__ = ("lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = 0

    def add(self, delta: int) -> None:
        with self.lock:
            self.value += delta


class TimerTaskList:
    """A bucket: a doubly linked circular list of tasks around a sentinel, with an expiration.

    The sentinel makes insert and remove branch-free and O(1). The bucket's expiration is the
    start of the tick it covers, or -1 while it is not queued in the timer's delay queue.
    ``add``/``remove``/``flush`` are thread-safe; they lock the task counter's lock (shared by
    all buckets of a timer, see :class:`TaskCounter`). Methods starting with ``_`` expect the
    caller to hold that lock already.
    """

    __slots__ = ("_counter", "_expiration_ms", "_lock", "_lock_acquire", "_lock_release", "_root")

    def __init__(self, task_counter: TaskCounter) -> None:
        self._counter = task_counter
        self._lock = task_counter.lock
        # Bound once for remove_task (every cancel): compiled, ``lock.acquire()`` looks the
        # method up by name on every call.
        self._lock_acquire = self._lock.acquire
        self._lock_release = self._lock.release
        self._expiration_ms = -1
        root = _Sentinel(0)
        root._next = root
        root._prev = root
        self._root: TimerTask = root

    def set_expiration(self, expiration_ms: int) -> bool:
        """Set the bucket's expiration; True iff it changed (the bucket must then be (re)queued)."""
        previous = self._expiration_ms
        self._expiration_ms = expiration_ms
        return previous != expiration_ms

    def get_expiration(self) -> int:
        return self._expiration_ms

    def add(self, entry: TimerTaskEntry) -> None:
        """Append ``entry``'s task (Kafka's API); a stale entry (task since re-placed) is ignored."""
        task = entry.timer_task
        while task._entry is entry:
            # Leave any other list first, outside our lock: that list may have another lock, and
            # holding two at once could deadlock against a move in the other direction.
            leave_bucket(task)
            with self._lock:
                if task._bucket is None and task._entry is entry:
                    task._expiration_ms = entry.expiration_ms
                    self._link(task)
                    return

    def remove(self, entry: TimerTaskEntry) -> None:
        if entry.timer_task._entry is entry:
            self.remove_task(entry.timer_task)

    def remove_task(self, task: TimerTask) -> None:
        """Unlink ``task`` if it is (still) in this bucket."""
        self._lock_acquire()  # not ``with``: see WheelTimerCore.schedule
        try:
            if task._bucket is self:
                self._unlink(task)
        finally:
            self._lock_release()

    def _link(self, task: TimerTask) -> None:
        # Caller holds the lock; ``task`` is in no bucket.
        root = self._root
        tail = root._prev
        assert tail is not None, "sentinel links are never None"
        task._next = root
        task._prev = tail
        task._bucket = self
        tail._next = task
        root._prev = task
        self._counter.value += 1

    def _unlink(self, task: TimerTask) -> None:
        # Caller holds the lock and has checked ``task._bucket is self``.
        prev = task._prev
        nxt = task._next
        assert prev is not None and nxt is not None, f"linked task without neighbours: {task!r}"
        nxt._prev = prev
        prev._next = nxt
        task._next = None
        task._prev = None
        task._bucket = None
        self._counter.value -= 1

    def _detach_all(self) -> TimerTask:
        """Empty the bucket in O(1) and reset its expiration; return the first task of the old
        chain, which runs through ``_next`` until it reaches the sentinel (``self._root``).

        Caller holds the lock and must unlink (``_release``) each task of the chain before
        releasing it: their ``_bucket`` still points here until then.
        """
        root = self._root
        first = root._next
        assert first is not None, "sentinel links are never None"
        root._next = root
        root._prev = root
        self._expiration_ms = -1
        return first

    def _release(self, task: TimerTask) -> None:
        # One task of a detached chain leaves the bucket (caller holds the lock).
        task._next = None
        task._prev = None
        task._bucket = None
        self._counter.value -= 1

    def flush(self, f: Callable[[TimerTaskEntry], None]) -> None:
        """Remove every task and hand each one's entry to ``f`` (re-insert or run), in order."""
        tasks: list[TimerTask] = []
        with self._lock:
            root = self._root
            task = self._detach_all()
            while task is not root:
                nxt = task._next
                assert nxt is not None
                self._release(task)
                tasks.append(task)
                task = nxt
        # ``f`` re-inserts into buckets (taking the lock): call it outside.
        for task in tasks:
            if not task._scheduled:
                continue  # cancelled while we were collecting
            entry = task._entry
            if entry is None:
                # Placed by a timer's fast path, which keeps no handle: make one now.
                entry = TimerTaskEntry(task, task._expiration_ms)
            f(entry)

    def foreach(self, f: Callable[[TimerTask], None]) -> None:
        """Apply ``f`` to each live (not cancelled) task in the bucket."""
        tasks: list[TimerTask] = []
        with self._lock:
            root = self._root
            task = root._next
            while task is not None and task is not root:
                if task._scheduled:
                    tasks.append(task)
                task = task._next
        for task in tasks:
            f(task)

    def __len__(self) -> int:
        with self._lock:
            n = 0
            root = self._root
            task = root._next
            while task is not None and task is not root:
                n += 1
                task = task._next
            return n

    def __lt__(self, other: TimerTaskList) -> bool:
        return self._expiration_ms < other._expiration_ms
