"""TimerTask and TimerTaskEntry: a task, and its one place in one bucket of a timing wheel."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._timer_task_list import TimerTaskList

__all__ = ["TimerTask", "TimerTaskEntry"]

# Kafka synchronises on each TimerTask to swap its entry. Under CPython's GIL a lock per task
# buys no parallelism but costs an allocation and ~60 bytes per pending timer, so every task
# shares this one lock; it guards only the task <-> entry association (a few bytecodes).
_ENTRY_LOCK = threading.Lock()


class TimerTask(ABC):
    """Something to run once ``delay_ms`` after it is added to a timer.

    A task is in at most one bucket: adding it again (to any timer) replaces its previous entry,
    and :meth:`cancel` unlinks that entry in O(1). Thread-safe: ``cancel`` may race with the timer
    flushing the bucket; the loser of that race sees a cancelled entry and does not run the task.
    """

    __slots__ = ("__weakref__", "_timer_task_entry", "delay_ms")

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self._timer_task_entry: TimerTaskEntry | None = None

    @abstractmethod
    def run(self) -> None:
        """Called once the delay has passed, on the timer's executor thread."""

    def cancel(self) -> None:
        """Remove this task from its timer, if it is in one. The task will not run."""
        with _ENTRY_LOCK:
            entry = self._timer_task_entry
            self._timer_task_entry = None
        if entry is not None:
            entry.remove()

    def is_cancelled(self) -> bool:
        """True when the task was cancelled, or never added to a timer."""
        return self._timer_task_entry is None

    def _set_timer_task_entry(self, entry: TimerTaskEntry) -> None:
        with _ENTRY_LOCK:
            previous = self._timer_task_entry
            self._timer_task_entry = entry
        # A task moving to a new entry must leave its old bucket: "a task is in at most one bucket".
        if previous is not None and previous is not entry:
            previous.remove()

    def _get_timer_task_entry(self) -> TimerTaskEntry | None:
        return self._timer_task_entry


class TimerTaskEntry:
    """A task's node in a :class:`TimerTaskList`: expiration, and the links of a doubly linked list."""

    __slots__ = ("expiration_ms", "list", "next", "prev", "timer_task")

    def __init__(self, timer_task: TimerTask, expiration_ms: int) -> None:
        self.timer_task = timer_task
        self.expiration_ms = expiration_ms
        # Set under the owning list's lock only; read without it to find which list to lock.
        self.list: TimerTaskList | None = None
        self.next: TimerTaskEntry | None = None
        self.prev: TimerTaskEntry | None = None
        timer_task._set_timer_task_entry(self)

    def cancelled(self) -> bool:
        """True once the task has been cancelled or re-added elsewhere: this entry must not run it."""
        return self.timer_task._timer_task_entry is not self

    def remove(self) -> None:
        # The entry may be moved to another bucket (flush + re-insert) between reading ``list``
        # and locking it; ``TimerTaskList.remove`` then does nothing, so retry until ``list`` is None.
        current = self.list
        while current is not None:
            current.remove(self)
            current = self.list

    def __lt__(self, other: TimerTaskEntry) -> bool:
        return self.expiration_ms < other.expiration_ms

    def __repr__(self) -> str:
        return f"TimerTaskEntry(expiration_ms={self.expiration_ms}, task={self.timer_task!r})"
