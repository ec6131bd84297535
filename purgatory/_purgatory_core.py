"""PurgatoryCore: the compiled body of DelayedOperationPurgatory, and its ExpiredOperationReaper.

Submitting, watching, key events, finishing and the reaper's step run for every request, so
this module is compiled with mypyc with the timer and the operation core (``purgatory bench
purgatory``: 1.05x -> 1.26x less CPU per request than the naive purgatory, together with the
module-level functions at the end). The public class,
:class:`purgatory.DelayedOperationPurgatory`, is an interpreted subclass in ``_purgatory.py``
holding the checked constructor and ``from_settings``: a compiled ``__init__`` would refuse
``name=5`` with mypyc's "str object expected; got int" before any check of ours could name the
field.
"""

from __future__ import annotations

import asyncio
import threading
import time
from _thread import get_ident
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

import structlog
from mypy_extensions import mypyc_attr

from . import _metrics
from ._errors import PurgatoryClosedError, PurgatoryFullError
from ._loop_handoff import draining_loop, handoff_for
from ._metrics import PurgatoryStats
from ._operation_core import (
    OperationCore,
    OwnLock,
    extras_of,
    finish,
    is_finished,
    own_acquire_as,
    own_release_as,
    safe_try_complete,
)
from ._outcome import Outcome
from ._watchers import (
    SHARDS,
    WatcherList,
    compact_after_finish,
    keys_not_holding,
    new_watch,
    release_watch,
    shard_index,
    watch,
)
from .timer import SystemTimer, Timer, add_task, cancel_task

if TYPE_CHECKING:
    # Types only: the compiled core never imports the interpreted public class built on it.
    from ._operation import DelayedOperation

__all__ = [
    "DEFAULT_PURGE_INTERVAL",
    "REAPER_POLL_MS",
    "ExpiredOperationReaper",
    "PurgatoryCore",
    "PurgatoryListener",
]

_log = structlog.get_logger("purgatory")

T = TypeVar("T", bound="DelayedOperation")

DEFAULT_PURGE_INTERVAL = 1000  # Kafka's default: purge once ~1000 completed ops linger in watch lists
REAPER_POLL_MS = 200  # Kafka's reaper waits at most 200 ms per advance_clock call

# Final: compiled, one vectorcall of the builtin, not a module-dict lookup (as _operation_core's).
_thread_id: Final = get_ident


class PurgatoryListener(Protocol):
    """Observes every operation's lifecycle (the journal is one). Called on the finishing thread.

    A listener may also define ``on_released(purgatory, op)``: called when the purgatory lets go
    of an op it announced in ``on_submitted`` without finishing it — the submission raised (user
    code, ``PurgatoryFullError``) or ``cancel_for_key`` handed it back to the caller.
    """

    def on_submitted(self, purgatory: str, op: DelayedOperation, keys: Sequence[Hashable]) -> None: ...

    def on_finished(self, purgatory: str, op: DelayedOperation) -> None: ...


class ExpiredOperationReaper(threading.Thread):
    """Drives the timer and purges completed operations from the watcher lists.

    Loops ``purgatory.advance_clock(poll_ms)`` until the purgatory shuts down. A daemon thread so
    an application that forgets ``shutdown()`` still exits; ``shutdown()`` wakes and joins it.
    """

    def __init__(self, purgatory: PurgatoryCore[Any], poll_ms: int) -> None:
        super().__init__(name=f"ExpirationReaper-{purgatory.broker_id}-{purgatory.name}", daemon=True)
        self._purgatory = purgatory
        self._poll_ms = poll_ms
        self._stopping = threading.Event()

    def initiate_shutdown(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._purgatory.advance_clock(self._poll_ms)
            except Exception:
                # The reaper must outlive any failure, or every pending operation would hang.
                _log.exception("reaper_iteration_failed", purgatory=self._purgatory.name)
                self._stopping.wait(self._poll_ms / 1000.0)


class LoopCallback:
    """The waiter of :meth:`PurgatoryCore.watch_then_call`: ``callback(op)`` once, on ``loop``.

    Called on the loop's thread it calls back at once; on any other thread it posts itself to
    the loop's :class:`LoopHandoff` (the batch of that burst), which calls it again there.
    ``called`` keeps the callback single (the submitter may call it too: see watch_then_call).
    An object, not a closure: the service parks tens of thousands of long polls, and a closure
    over the loop, the hand-off, the flag and the callback was a function and four cells, ~350 B
    of each (tracemalloc); this is one small object.
    """

    __slots__ = ("callback", "called", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[OperationCore], None]) -> None:
        self.loop = loop
        self.callback = callback
        self.called = False

    def __call__(self, finished: OperationCore) -> None:
        if self.called:
            return
        # A finish inside the loop's own hand-off drain (a produce's delivery reports are applied
        # there) is on the loop: known without asyncio's running-loop lookup, which on CPython
        # 3.11 is a getpid() system call. Else _get_running_loop (None off the loop) rather than
        # get_running_loop: the finishing thread is usually not the loop's, and raising and
        # catching RuntimeError there cost ~1 µs of each of 10,000 completions of one key event
        # (purgatory bench fanout). Not the thread id: a loop may run on another thread later.
        if draining_loop() is self.loop or asyncio._get_running_loop() is self.loop:
            self.called = True
            self.callback(finished)
        else:
            handoff_for(self.loop).post_call(self, finished)


@mypyc_attr(allow_interpreted_subclasses=True)  # DelayedOperationPurgatory, and applications'
class PurgatoryCore(Generic[T]):
    """Everything of :class:`purgatory.DelayedOperationPurgatory` but its checked constructor."""

    def __init__(
        self,
        name: str,
        timer: Timer | None,
        broker_id: int,
        purge_interval: int,
        reaper_enabled: bool,
        timer_enabled: bool,
        max_pending: int | None,
        reaper_poll_ms: int,
        max_pending_per_key: int | None = None,
    ) -> None:
        # Arguments arrive checked (DelayedOperationPurgatory.__init__).
        self.name = name
        self.broker_id = broker_id
        self.purge_interval = purge_interval
        self.max_pending = max_pending
        self.max_pending_per_key = max_pending_per_key
        self.reaper_enabled = reaper_enabled
        self.timer_enabled = timer_enabled
        self._owns_timer = timer is None
        self._timer: Timer = timer if timer is not None else SystemTimer(name)
        # The same timer when it is exactly a SystemTimer (no interpreted override of ``add``):
        # submit then calls add_task directly instead of a Python-level method call.
        self._system_timer: SystemTimer | None = self._timer if type(self._timer) is SystemTimer else None
        self._shards = [WatcherList() for _ in range(SHARDS)]
        # Operations counted once each when first watched. Kafka uses an AtomicInteger; here a
        # lost increment under a thread race only delays a purge a little, so no lock is taken.
        self._estimated_total = 0
        self._closed = False
        self._shutdown_lock = threading.Lock()
        self._listeners: list[PurgatoryListener] = []
        # Per thread: the keys its check_and_complete calls are passing over, each with "asked
        # again meanwhile" (see check_and_complete: re-entrant calls are deferred).
        self._checking = threading.local()
        self.stats = PurgatoryStats(_mock_clock_ns(self._timer))
        _metrics.register(self)  # metrics registered at construction, removed at shutdown
        self._reaper: ExpiredOperationReaper | None = None
        if reaper_enabled:
            self._reaper = ExpiredOperationReaper(self, reaper_poll_ms)
            self._reaper.start()

    # -- submission ---------------------------------------------------------------------------

    def _shard(self, key: Hashable) -> WatcherList:
        return self._shards[shard_index(key)]

    def try_complete_else_watch(self, op: T, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if it can be, else watch it on every key and time it.

        Returns True iff this call completed it. An op already finished when submitted (completed
        by another thread before this call) is neither watched nor timed, and False is returned,
        as in Kafka. Kafka's story about lock applies: the first check, the watching and the
        second check all happen under ``op.lock``, so a key event between the checks cannot be
        missed (the op is on every watch list before the second check) and a concurrent
        ``check_and_complete`` cannot finish it half-watched.
        """
        # Calls, not field reads, for the two flags checked on entry: mypy would narrow the fields
        # and call the later checks (another thread may flip them meanwhile) unreachable.
        if _is_closed(self):
            raise PurgatoryClosedError(self.name)
        # OperationCore is private: in practice every instance is a DelayedOperation.
        if not isinstance(op, OperationCore):
            raise TypeError(f"op must be a DelayedOperation, got {type(op).__name__}: {op!r}")
        # The same object, typed as the compiled OperationCore whose fields and methods it uses.
        core: OperationCore = op
        # Every read of ``core.outcome`` below is ``is_finished(core)``, a call: another thread may
        # finish the op at any moment (force_complete takes no lock we hold), but mypy narrows a
        # field after an ``is None`` test and mypyc then *checks* the narrowed type on the next
        # read — "TypeError: None object expected; got Outcome" under a racing force_complete
        # (tests/core/test_concurrency.py::test_submissions_racing_force_complete_finish_each_once).
        if isinstance(keys, (str, bytes)):  # a tuple, not `str | bytes`: no Union built per call
            # A str is iterable: it would silently be watched on each of its characters.
            raise TypeError(
                f"keys must be a collection of watch keys, got a single {type(keys).__name__}: {keys!r}"
            )
        if isinstance(keys, (list, tuple)):
            watch_keys = keys
        else:
            try:
                watch_keys = list(keys)
            except TypeError:
                raise TypeError(
                    f"keys must be a collection of watch keys, got {type(keys).__name__}: {keys!r}"
                ) from None
        if not watch_keys:
            raise ValueError("keys must name at least one watch key; got an empty collection")
        # Checked before anything is watched: a bad third key must not leave two keys watched.
        # One loop per type: compiled, a list or a tuple is iterated by index, a Sequence through
        # an allocated iterator (see _watchers' note on key loops).
        if isinstance(watch_keys, list):
            for key in watch_keys:
                _check_hashable(key)
        else:
            for key in watch_keys:
                _check_hashable(key)
        if is_finished(core):
            # Finished before it was submitted (Kafka's performance tool completes ~1.4% of its
            # requests before submitting them): as Kafka's tryCompleteElseWatch, keep nothing and
            # return False (this call did not complete it). on_complete ran once, at its finish.
            # (tests/core/test_purgatory.py::test_operation_finished_before_submission_is_not_kept)
            return False
        core._owner = self
        # The start of the latency its finish counts (PurgatoryStats): before the first try.
        core._started_ns = self.stats.now_ns()
        # Re-submitted after cancel_for_key: it is the purgatory's again, so drain must finish it
        # (tests/tools/test_faults.py, resubmitted after cancel_for_key).
        core._keys_cancelled = False
        listeners = self._listeners
        if listeners:
            extras_of(core).submitted_ns = time.monotonic_ns()
            for listener in listeners:
                listener.on_submitted(self.name, op, watch_keys)

        try:
            # Kafka's safeTryCompleteOrElse: try, watch, try again, all under op.lock.
            given = core._lock
            if given is None or type(given) is OwnLock:
                # The op's own lock: two native steps, no lock object (see OwnLock).
                me = _thread_id()  # once for the pair (see own_acquire_as)
                own_acquire_as(core, me, True, -1.0)
                try:
                    tried = _try_else_watch(self, core, watch_keys)
                finally:
                    own_release_as(core, me)
            else:
                with given:
                    tried = _try_else_watch(self, core, watch_keys)
            if tried == _TRIED_COMPLETED:
                return True
            if tried == _TRIED_FINISHED_ELSEWHERE:
                return False

            if not is_finished(core):
                if self._closed:
                    # shutdown() began while we were watching. Its drain may or may not have seen
                    # this op; expiring it here is safe either way (the finish is claimed once).
                    finish(core, Outcome.EXPIRED)
                    return False
                if self.timer_enabled:
                    try:
                        system_timer = self._system_timer
                        if system_timer is not None:
                            add_task(system_timer, core)
                        else:
                            self._timer.add(op)
                    except PurgatoryClosedError:
                        # The owned timer closed under us: shutdown's drain saw the op (it was
                        # watched before _closed was set, or we would have taken the branch above).
                        finish(core, Outcome.EXPIRED)
                        return False
                # Completed between the check and the add: take the entry out of the wheel again.
                if is_finished(core):
                    cancel_task(core)
            return False
        except BaseException:
            # Refused (full, closed timer) or user code raised: the op is neither watched nor
            # timed. Listeners that track what is watched (the Kafka change feed) let go of it.
            if listeners:
                self._released(op)
            raise

    async def watch(self, op: T, keys: Iterable[Hashable]) -> Outcome:
        """asyncio: submit ``op`` and wait for its outcome without blocking the event loop.

        Finishing on another thread is handed to the loop through its :class:`LoopHandoff`
        (one wake-up for every outcome finished since the last, not one per operation).
        Cancelling the awaiting task finishes the op as ``Outcome.CANCELLED`` (``on_complete``
        once, ``on_expiration`` never) and removes its timer entry.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        # Finishes on other threads reach the loop in batches: one wake-up per batch, not per op.
        handoff = handoff_for(loop)

        def resolve(finished: OperationCore) -> None:
            outcome = finished.outcome
            assert outcome is not None, "outcome is set before waiters are told"
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                if not future.done():
                    future.set_result(outcome)
            else:
                handoff.post(future, outcome)

        extras_of(op).waiter = resolve
        self.try_complete_else_watch(op, keys)
        outcome = op.outcome
        if outcome is not None and not future.done():
            # Finished before the waiter was set (another thread completed it before or while we
            # submitted): its finish may not have seen the waiter, so resolve here. A finish that
            # did see it resolves the same future; done() keeps the result single.
            future.set_result(outcome)
        try:
            return await future
        except asyncio.CancelledError:
            op._cancel_operation()
            raise

    def watch_then_call(
        self,
        op: T,
        keys: Iterable[Hashable],
        callback: Callable[[T], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """asyncio, without a task: submit ``op``; ``callback(op)`` runs on this loop once it finished.

        What :meth:`watch` does for a task, for a waiter that is a callback (the service's
        protocol-level long polls: the callback writes the answer, nothing awaits). Called on the
        loop's thread; a finish there calls back at once, a finish on another thread reaches the
        loop through its :class:`LoopHandoff` with the other outcomes of its burst. ``callback``
        runs exactly once (if the op finished before this returned, it runs all the same). A
        waiter that leaves calls :meth:`abandon`. Raises as :meth:`try_complete_else_watch`; the
        callback is then never called. ``loop``: the running loop, when the caller has it at hand
        (saves asyncio's lookup of it).
        """
        running = asyncio.get_running_loop() if loop is None else loop  # given: the caller's running loop
        waiter = LoopCallback(running, cast(Callable[[OperationCore], None], callback))
        extras_of(op).waiter = waiter
        self.try_complete_else_watch(op, keys)
        if op.outcome is not None:
            # Finished before the waiter was set (see watch): its finish may not have called it.
            waiter(op)

    def abandon(self, op: T) -> bool:
        """Finish ``op`` as ``CANCELLED``: its waiter left (as cancelling :meth:`watch`'s task does)."""
        return op._cancel_operation()

    # -- key events ---------------------------------------------------------------------------

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete the operations watched on ``key``; return how many this call finished.

        Re-entrant calls on the same key are *deferred*: user code that this call runs
        (``try_complete``, or ``on_complete`` of an op it finishes) may call
        ``check_and_complete(key)`` again on the same thread; that inner call returns 0 at once
        and the outer call makes another pass over the key once its current pass ends (it
        counts what that pass finishes). Passes repeat while re-checks are asked for, but a
        re-check pass that finishes nothing ends the loop: an op asking on every try without
        anything changing would otherwise spin. Recursing instead (Kafka does: its op lock is
        re-entrant) grew the stack without bound and starved the key's other ops. Calls on
        other keys, and on this key from other threads, run as usual.
        """
        local = self._checking
        checking: dict[Hashable, bool] | None = getattr(local, "keys", None)
        if checking is None:
            checking = {}
            local.keys = checking
        if key in checking:
            checking[key] = True  # the outer call on this thread passes over the key again
            return 0
        checking[key] = False
        completed = 0
        try:
            finished = _check_key(self, key)
            completed += finished
            rechecks = 0
            while checking[key] and (rechecks == 0 or finished > 0):
                checking[key] = False
                rechecks += 1
                finished = _check_key(self, key)
                completed += finished
        finally:
            del checking[key]
        return completed

    def cancel_for_key(self, key: Hashable) -> list[T]:
        """Stop watching ``key``; cancel the timer entries of its operations (not finished).

        Returned operations are the caller's: they are no longer timed, and drain skips them.
        """
        ops = self._shard(key).cancel(key)
        for op in ops:
            op._keys_cancelled = True
            op.cancel()
            if self._listeners:
                self._released(op)
        return ops  # type: ignore[return-value]

    # -- sizes --------------------------------------------------------------------------------

    def watched(self) -> int:
        """Watcher entries over all keys, completed-but-not-yet-purged ones included."""
        return sum(shard.count_watched() for shard in self._shards)

    def num_delayed(self) -> int:
        """Operations in the timer (the timer's ``size()``)."""
        return self._timer.size()

    # -- reaper -------------------------------------------------------------------------------

    def advance_clock(self, timeout_ms: int) -> None:
        """One reaper step: advance the timer, then purge if enough completed ops linger.

        Tests on a MockTimer (reaper disabled) call this to trigger the purge deterministically.
        """
        self._timer.advance_clock(timeout_ms)
        # estimated_total - num_delayed approximates completed ops still in watch lists.
        delayed = self.num_delayed()
        if self._estimated_total - delayed > self.purge_interval:
            # Reset first: ops completing during the purge make the next estimate a bit high,
            # never low, so nothing is left unpurged for long.
            self._estimated_total = delayed
            self.purge_completed()

    def purge_completed(self) -> int:
        """Remove finished operations from every watch list now; return how many entries went.

        The reaper calls this when its estimate says enough finished operations linger; call it
        directly to make ``watched()`` exact (tests, or before taking a measurement).
        """
        return sum(shard.purge_completed() for shard in self._shards)

    # -- shutdown -----------------------------------------------------------------------------

    def shutdown(self, drain: bool = True) -> None:
        """Stop the reaper (woken at once) and, with ``drain``, expire everything still held.

        Drain runs on the calling thread: each pending operation is claimed as EXPIRED,
        ``on_complete`` then ``on_expiration``. Operations returned by ``cancel_for_key`` are
        the caller's and are left alone. A submission racing this call is either refused with
        ``PurgatoryClosedError`` or drained (see ``try_complete_else_watch``). ``drain=False`` is
        Kafka's behaviour: pending operations are left unexecuted. Idempotent.
        """
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
        reaper = self._reaper
        if reaper is not None:
            reaper.initiate_shutdown()
            wakeup = getattr(self._timer, "wakeup", None)
            if callable(wakeup):
                wakeup()
            if threading.current_thread() is not reaper:
                reaper.join()
        if drain:
            for shard in self._shards:
                for op in shard.all_ops():
                    if not op._keys_cancelled:
                        op._expire()
        if self._owns_timer:
            self._timer.close()
        _metrics.unregister(self)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- observers ----------------------------------------------------------------------------

    def add_listener(self, listener: PurgatoryListener) -> None:
        self._listeners = [*self._listeners, listener]  # copy-on-write: readers never lock

    def remove_listener(self, listener: PurgatoryListener) -> None:
        self._listeners = [item for item in self._listeners if item is not listener]

    def _released(self, op: OperationCore) -> None:
        # Optional listener hook (not part of PurgatoryListener, so older listeners still fit).
        for listener in self._listeners:
            on_released = getattr(listener, "on_released", None)
            if on_released is None:
                continue
            try:
                on_released(self.name, cast("DelayedOperation", op))
            except Exception:
                _log.exception("listener_failed", purgatory=self.name, listener=repr(listener))

    def operation_finished(self, op: OperationCore) -> None:
        # Release the finished op from all its keys now (KAFKA-19389: a completed operation kept
        # alive — with its response data — by its other watch keys until the next purge). One
        # store, then a dead count per key that compacts lists once half dead. A watch racing
        # this release is released again by the watcher itself (try_complete_else_watch); the
        # purge remains the safety net.
        entry = op._watch
        if entry is not None:
            op._watch = None
            keys = entry.keys  # before the release: from then on the entry may be another op's
            # One store releases the op from all its lists (see Watch): nothing keeps it alive.
            release_watch(entry, op)
            # Released here, so it will not linger for the reaper to purge: keep it out of the
            # estimate that triggers purges (else every purge_interval finishes would start a
            # full scan finding nothing — 11% of a 100k-pending profile).
            self._estimated_total -= 1
            compact_after_finish(self._shards, keys)
        listeners = self._listeners
        if not listeners:
            return
        for listener in listeners:
            try:
                listener.on_finished(self.name, cast("DelayedOperation", op))
            except Exception:
                _log.exception("listener_failed", purgatory=self.name, listener=repr(listener))

    def user_code_failed(self, op: OperationCore, callback: str, exc: BaseException) -> None:
        self.stats.error()
        _log.error(
            "user_callback_failed",
            purgatory=self.name,
            callback=callback,
            operation=type(op).__name__,
            exc_info=exc,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, watched={self.watched()}, "
            f"delayed={self.num_delayed()}, closed={self._closed})"
        )


# Module-level functions, not methods, for what runs on every request: compiled code calls a
# method of PurgatoryCore (which allows interpreted subclasses) through Python-level dispatch,
# a function directly (see purgatory/_operation_core.py).


def _mock_clock_ns(timer: Timer) -> Callable[[], int] | None:
    """The latency clock of a purgatory on ``timer``: a MockTimer's mock time (``timer.time``,
    duck-typed: the core does not import the testing module), so that tests see the latencies
    they stage; None (the monotonic clock) for any other timer."""
    nanoseconds = getattr(getattr(timer, "time", None), "nanoseconds", None)
    return nanoseconds if callable(nanoseconds) else None


def _is_closed(purgatory: PurgatoryCore[Any]) -> bool:
    # A call, not a field read: mypy would narrow the field, and it may flip on another thread
    # mid-submission.
    return purgatory._closed


def _check_hashable(key: Hashable) -> None:
    """A clear TypeError naming ``key`` if it is unhashable."""
    # A str or an int always hashes (the common keys: topic-partitions as strings, ids): one type
    # test instead of a hash call whose result, compiled, is boxed half the time only to be dropped.
    if type(key) is str or type(key) is int:
        return
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"watch key {key!r} of type {type(key).__name__} is unhashable; keys must be hashable"
        ) from None


# What _try_else_watch found (an int: compiled, no object per call).
_TRIED_COMPLETED: Final = 0  # a try completed the op: this submission returns True
_TRIED_FINISHED_ELSEWHERE: Final = 1  # another thread finished it meanwhile: return False
_TRIED_WATCHED: Final = 2  # watched on every key, not finished: time it next


def _try_else_watch(
    purgatory: PurgatoryCore[Any], core: OperationCore, watch_keys: Sequence[Hashable]
) -> int:
    """The part of ``try_complete_else_watch`` that runs under ``op.lock``: try to complete,
    else watch on every key and try again (Kafka's story about lock: a key event between the
    two tries cannot be missed, the op being on every watch list before the second)."""
    # First try: user code; if it raises, nothing was watched or timed yet.
    if core.try_complete():
        return _TRIED_COMPLETED
    max_pending = purgatory.max_pending
    if max_pending is not None:
        pending = purgatory._timer.size()
        if pending >= max_pending:
            raise PurgatoryFullError(purgatory.name, pending, max_pending)
    max_per_key = purgatory.max_pending_per_key
    if max_per_key is not None:
        # O(keys): one dict lookup per key, and a count of the list's live entries only when its
        # length less the deaths known says it may be full. Best effort like max_pending:
        # concurrent submitters on one key may overshoot by at most their number.
        for key in watch_keys:
            on_key = purgatory._shards[shard_index(key)].watchers_by_key.get(key)
            if on_key is not None and len(on_key.ops) - on_key.dead >= max_per_key:
                live = on_key.live()
                if live >= max_per_key:
                    raise PurgatoryFullError(purgatory.name, live, max_per_key, key)
    # Set before the first append: whoever finishes the op from now on releases it from every
    # list holding this entry (operation_finished). An op handed back by cancel_for_key and
    # submitted again keeps its entry, which then joins the new keys' lists too.
    shards = purgatory._shards
    entry = core._watch
    if entry is None or entry.op is not core:
        entry = new_watch(core, watch_keys)
        core._watch = entry
        watch(shards, core, watch_keys, entry)
    else:
        # Still on the lists of keys other than the cancelled one: join only the others.
        entry.keys = list(dict.fromkeys([*entry.keys, *watch_keys]))
        watch(shards, core, keys_not_holding(shards, watch_keys, entry), entry)
    purgatory._estimated_total += 1
    if is_finished(core):
        # Finished on another thread while we watched (force_complete needs no lock). Its
        # finisher released the entry, but may have done so before our append on a later key:
        # release it again, so no watch list keeps the op alive.
        release_watch(entry, core)
        return _TRIED_FINISHED_ELSEWHERE
    try:
        if core.try_complete():
            return _TRIED_COMPLETED
    except BaseException:
        # Neither watched nor timed when the error propagates: release it from every list.
        core._watch = None
        release_watch(entry, core)
        raise
    return _TRIED_WATCHED


def _check_key(purgatory: PurgatoryCore[Any], key: Hashable) -> int:
    """One pass of ``check_and_complete`` over the ops watched on ``key``; how many it finished."""
    completed = 0
    # No removals here: an op finishing (here or anywhere) releases itself from all its keys
    # (operation_finished), and a watch racing that finish is released again by the watcher.
    for op in purgatory._shard(key).snapshot(key):
        try:
            if safe_try_complete(op):  # False for an op already finished elsewhere
                completed += 1
        except Exception as exc:
            # One op's failure must not starve the others on this key; it stays watched and timed.
            purgatory.user_code_failed(op, "try_complete", exc)
    return completed
