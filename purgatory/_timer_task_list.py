"""TimerTaskList: one bucket of a timing wheel."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._timer_task import TimerTaskEntry

__all__ = ["TaskCounter", "TimerTaskList"]


class TaskCounter:
    """The pending-task count shared by every bucket of one timer (Kafka's ``AtomicInteger``).

    Buckets update it under their own locks, which are different locks, so the count keeps
    its own: ``+= 1`` on an attribute is not atomic across threads.
    """

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, delta: int) -> None:
        with self._lock:
            self.value += delta


class TimerTaskList:
    """A bucket: a doubly linked circular list of entries around a sentinel, with an expiration.

    The sentinel makes insert and remove branch-free and O(1). The bucket's expiration is the
    start of the tick it covers, or -1 while it is not queued in the timer's delay queue.
    ``add``/``remove``/``flush`` are thread-safe (one lock per bucket, as Kafka's ``synchronized``).
    """

    __slots__ = ("__weakref__", "_expiration_ms", "_lock", "_root", "_task_counter")

    def __init__(self, task_counter: TaskCounter) -> None:
        self._task_counter = task_counter
        self._lock = threading.Lock()
        self._expiration_ms = -1
        root = TimerTaskEntry.__new__(TimerTaskEntry)  # sentinel: carries no task
        root.expiration_ms = -1
        root.list = None
        root.next = root
        root.prev = root
        self._root = root

    def set_expiration(self, expiration_ms: int) -> bool:
        """Set the bucket's expiration; True iff it changed (the bucket must then be (re)queued)."""
        previous = self._expiration_ms
        self._expiration_ms = expiration_ms
        return previous != expiration_ms

    def get_expiration(self) -> int:
        return self._expiration_ms

    def add(self, entry: TimerTaskEntry) -> None:
        done = False
        while not done:
            # Remove from any other list first, outside our lock: holding two bucket locks at
            # once could deadlock against a concurrent move in the other direction.
            entry.remove()
            with self._lock:
                if entry.list is None:
                    root = self._root
                    tail = root.prev
                    assert tail is not None, "sentinel links are never None"
                    entry.next = root
                    entry.prev = tail
                    entry.list = self
                    tail.next = entry
                    root.prev = entry
                    self._task_counter.add(1)
                    done = True

    def remove(self, entry: TimerTaskEntry) -> None:
        with self._lock:
            self._unlink(entry)

    def _unlink(self, entry: TimerTaskEntry) -> bool:
        # Caller holds self._lock. The entry may have moved to another list meanwhile: then skip.
        if entry.list is not self:
            return False
        prev, nxt = entry.prev, entry.next
        assert prev is not None and nxt is not None, f"linked entry without neighbours: {entry!r}"
        nxt.prev = prev
        prev.next = nxt
        entry.next = None
        entry.prev = None
        entry.list = None
        self._task_counter.add(-1)
        return True

    def flush(self, f: Callable[[TimerTaskEntry], None]) -> None:
        """Remove every entry and hand each to ``f`` (re-insert or run); reset the expiration."""
        with self._lock:
            entries: list[TimerTaskEntry] = []
            head = self._root.next
            while head is not None and head is not self._root:
                self._unlink(head)
                entries.append(head)
                head = self._root.next
            self._expiration_ms = -1
        # ``f`` re-inserts into other buckets (taking their locks): call it outside ours.
        for entry in entries:
            f(entry)

    def foreach(self, f: Callable[[object], None]) -> None:
        """Apply ``f`` to each live (not cancelled) task in the bucket."""
        with self._lock:
            tasks = []
            entry = self._root.next
            while entry is not None and entry is not self._root:
                if not entry.cancelled():
                    tasks.append(entry.timer_task)
                entry = entry.next
        for task in tasks:
            f(task)

    def __len__(self) -> int:
        with self._lock:
            n = 0
            entry = self._root.next
            while entry is not None and entry is not self._root:
                n += 1
                entry = entry.next
            return n

    def __lt__(self, other: TimerTaskList) -> bool:
        return self._expiration_ms < other._expiration_ms
