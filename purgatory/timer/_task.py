"""TimerTask and TimerTaskEntry: a task, and its one place in one bucket of a timing wheel.

Performance design (figures from ``purgatory bench timer``; docs/performance.md). Kafka pays two
objects per pending timer: the task and a ``TimerTaskEntry`` node linked into a bucket. Here the
task *is* the node: its ``_next``/``_prev``/``_bucket``/``_expiration_ms`` fields are the links,
so adding a timer allocates nothing (no entry, and under mypyc no int objects either: typed
``int`` fields are stored unboxed). No allocation means no cyclic-GC work (0 collections in W1-W3
where the heapq baseline runs 131+, up to 0.4 s of GC at 100k) and 56 bytes per pending timer
beyond the task's own payload (heapq with list entries: 156). ``TimerTaskEntry`` remains as
Kafka's public handle ("this task, due at this time") for code that drives ``TimerTaskList`` or
``TimingWheel`` directly; the timers' hot path never creates one.

These modules are typed and slotted so that mypyc compiles them into native classes (see
``purgatory/_accel.py`` and ``setup.py``); the same source runs interpreted as the fallback.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Final

from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from ._task_list import TimerTaskList

__all__ = ["TimerTask", "TimerTaskEntry"]


# Class -> its unimplemented abstract methods ("" once known concrete), filled on first use.
_ABSTRACT_METHODS: Final[dict[type, str]] = {}


def _abstract_methods(cls: type) -> str:
    """What ``cls`` leaves abstract, as ABCMeta would compute it (cached per class).

    TimerTask cannot be an ``abc.ABC``: mypyc gives a native class with a Python base a
    ``__weakref__`` slot that its deallocator never clears (a weakly referenced task then crashes
    the interpreter when freed), and compiled classes skip ABC's instantiation check anyway.
    So the check is done here, for compiled and pure classes alike.
    """
    missing = _ABSTRACT_METHODS.get(cls)
    if missing is None:
        names = {
            name for name in dir(cls) if getattr(getattr(cls, name, None), "__isabstractmethod__", False)
        }
        if getattr(cls, "run", None) is _BASE_RUN:  # compiled methods carry no __isabstractmethod__
            names.add("run")
        missing = ", ".join(sorted(names))
        _ABSTRACT_METHODS[cls] = missing
    return missing


@mypyc_attr(allow_interpreted_subclasses=True)  # users (and DelayedOperation) subclass it in Python
class TimerTask:
    """Something to run once ``delay_ms`` after it is added to a timer. Abstract: ``run()``.

    A task is in at most one bucket: adding it again (to any timer) replaces its previous place,
    and :meth:`cancel` unlinks it in O(1). Thread-safe: ``cancel`` may race with the timer
    flushing the bucket; the loser of that race sees a cancelled task and does not run it. (As in
    Kafka, a task already handed to the timer's executor runs even if cancelled afterwards.)

    The link fields belong to the bucket holding the task and change only under that bucket's
    lock; ``_bucket`` is read without it to find which lock to take. Subclasses with
    ``__slots__`` add ``"__weakref__"`` to them if they want weak references.
    """

    __slots__ = ("_bucket", "_entry", "_expiration_ms", "_next", "_prev", "_scheduled", "delay_ms")

    def __init__(self, delay_ms: int) -> None:
        cls = type(self)
        missing = _ABSTRACT_METHODS.get(cls)
        if missing is None:
            missing = _abstract_methods(cls)
        if missing:
            raise TypeError(
                f"Can't instantiate abstract class {cls.__name__} with abstract methods {missing}"
            )
        self.delay_ms = delay_ms
        self._expiration_ms = 0
        self._bucket: TimerTaskList | None = None
        self._next: TimerTask | None = None
        self._prev: TimerTask | None = None
        # The Kafka-style handle this task was last placed with, if any (None on the fast path).
        self._entry: TimerTaskEntry | None = None
        # True from add until cancel: Kafka's "timerTaskEntry != null". Assigned last: the
        # 1-byte bool then shares its word with the first field of OperationCore (mypyc lays
        # fields out in assignment order).
        self._scheduled = False

    @abstractmethod
    def run(self) -> None:
        """Called once the delay has passed, on the timer's executor thread."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Remove this task from its timer, if it is in one. The task will not run."""
        cancel_task(self)

    def is_cancelled(self) -> bool:
        """True when the task was cancelled, or never added to a timer."""
        return not self._scheduled


_BASE_RUN = TimerTask.run


# Module-level functions, not methods: compiled code calls a method of TimerTask (which allows
# interpreted subclasses) through Python-level dispatch, a function directly (a visible share of
# W1's cancel when it was a method).


def cancel_task(task: TimerTask) -> None:
    """``task.cancel()`` as a function, for compiled callers."""
    # Flag first, lock-free: a flush already holding the bucket's lock then drops the task.
    task._scheduled = False
    task._entry = None
    leave_bucket(task)


def leave_bucket(task: TimerTask) -> None:
    """Take ``task`` out of the bucket holding it, if any (its flags are the caller's business)."""
    # The task may move to another bucket (flush + re-insert) between reading ``_bucket`` and
    # locking it; ``remove_task`` then does nothing, so retry until ``_bucket`` is None.
    bucket = task._bucket
    while bucket is not None:
        bucket.remove_task(task)
        bucket = task._bucket


class _Sentinel(TimerTask):
    """The root node of a bucket's circular list: never scheduled, never run."""

    __slots__ = ()

    def run(self) -> None:  # pragma: no cover - a sentinel is never due
        raise AssertionError("a bucket's sentinel is never run")


class TimerTaskEntry:
    """Kafka's handle for "this task, due at ``expiration_ms``", as used by ``TimerTaskList.add``.

    Creating an entry makes it the task's current one and takes the task out of its previous
    bucket (Kafka: "if this timerTask is already held by an existing timer task entry,
    setTimerTaskEntry will remove it"). An entry is ``cancelled()`` once the task has been
    cancelled or placed again through another entry or a timer.
    """

    __slots__ = ("expiration_ms", "timer_task")

    def __init__(self, timer_task: TimerTask, expiration_ms: int) -> None:
        self.timer_task = timer_task
        self.expiration_ms = expiration_ms
        leave_bucket(timer_task)
        timer_task._entry = self
        timer_task._scheduled = True

    @property
    def list(self) -> TimerTaskList | None:
        """The bucket holding this entry's task, or None (flushed, cancelled, replaced)."""
        task = self.timer_task
        return task._bucket if task._entry is self else None

    def cancelled(self) -> bool:
        """True once the task has been cancelled or re-added elsewhere: this entry must not run it."""
        return self.timer_task._entry is not self

    def remove(self) -> None:
        """Take the task out of its bucket if this entry is still the task's current one."""
        if self.timer_task._entry is self:
            leave_bucket(self.timer_task)

    def __lt__(self, other: TimerTaskEntry) -> bool:
        return self.expiration_ms < other.expiration_ms

    def __repr__(self) -> str:
        return f"TimerTaskEntry(expiration_ms={self.expiration_ms}, task={self.timer_task!r})"
