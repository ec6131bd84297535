"""OperationCore: the compiled half of DelayedOperation — the claim, the finish, the locked checks.

Every operation runs this code once or twice per request (submit, finish), so it is compiled
with mypyc with the timer (``purgatory bench purgatory``: the submit-and-finish path of a
request 3.9 -> 3.1 us). The public class, :class:`purgatory.DelayedOperation`, is a thin
interpreted subclass in ``_operation.py`` that keeps the documented contract; the constructor
here takes ``delay_ms`` as ``object`` and checks it itself, so a bad value gets an error naming
the field (typed ``int``, mypyc would refuse a float with "int object expected; got float").
"""

from __future__ import annotations

import threading
import time
from _thread import get_ident
from collections.abc import Callable, Hashable, Sequence
from typing import Final, Protocol

import structlog
from mypy_extensions import mypyc_attr

from . import _accel
from ._metrics import PurgatoryStats
from ._outcome import Outcome
from .timer import TimerTask, cancel_task

__all__ = ["Extras", "LockLike", "OperationCore", "OperationOwner", "OwnLock", "Waiter", "Watch", "extras_of"]

_log = structlog.get_logger("purgatory.operation")

# Guards every operation's claim (finish) and the outcome counters. Final: compiled code reads
# it as a C static instead of looking it up in the module's dict on every finish.
_CLAIM_LOCK: Final = threading.Lock()

# The state of every operation's own lock (see OwnLock) changes only under this one lock, and a
# thread waiting for an operation's lock waits on this condition. Nothing under it runs user
# code, so it is held for a few native steps, like the claim lock (compiled: no Python code
# runs while it is held but for the contended path's Condition calls).
_OWN_LOCKS_GUARD: Final = threading.Lock()
_OWN_LOCK_RELEASED: Final = threading.Condition(_OWN_LOCKS_GUARD)

# Kafka's delayMs is a Java long: a larger delay is no timeout at all (2**63 ms is 292 million
# years), and mostly a unit mistake (ns for ms).
MAX_DELAY_MS: Final = 2**63 - 1

# The hot paths call these bound methods and this builtin through Final statics: compiled,
# ``lock.acquire()`` looks the method up by name on every call (PyObject_VectorcallMethod, ~430
# instructions) and a module-level function imported from _thread is fetched from the module's
# dict; a Final callable is one vectorcall.
_claim_acquire: Final = _CLAIM_LOCK.acquire
_claim_release: Final = _CLAIM_LOCK.release
_guard_acquire: Final = _OWN_LOCKS_GUARD.acquire
_guard_release: Final = _OWN_LOCKS_GUARD.release
_thread_id: Final = get_ident


class _Waiting:
    """How many threads wait on ``_OWN_LOCK_RELEASED`` (changed under the guard): releases
    notify only while someone waits, so the uncontended path runs no Condition code."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


_WAITING: Final = _Waiting()

# Compiled (mypyc), reading and writing an operation's native field runs no Python code, so no
# other thread runs between the read of ``_lock_state`` and the write after it (the GIL changes
# hands only inside calls): the uncontended own-lock steps take no guard, which saved two of the
# three calls of each acquire and release (callgrind: 31.9k -> 30.7k instructions per request).
# Interpreted, a thread switch may fall between any two bytecodes: every step takes the guard.
# (A free-threaded build would need the guard compiled too; this project targets the GIL.)
_NATIVE_STEPS: Final = _accel.compiled()

# An own lock's state word: (owner's thread ident << OWNER_SHIFT) | depth. The ident is
# threading.get_ident() (pthread_self, a user-space address below 2**47 on x86-64 and arm64),
# not get_native_id(): that is a gettid system call on every acquire and release, ~8% of a
# request's CPU (perf, the bench's per-request work in one thread). 47 + 15 bits keep the word a
# short int (mypyc: unboxed below 2**62); an ident above 2**47 makes it a boxed int, slower but
# still right. The depth then stops at DEPTH_MAX (RLock's "lock count overflowed" sits higher).
OWNER_SHIFT: Final = 15
DEPTH_MAX: Final = (1 << OWNER_SHIFT) - 1


class LockLike(Protocol):
    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> object: ...


class OperationOwner(Protocol):
    """The purgatory holding an operation: told of its finish and of user-code failures."""

    # The concrete (compiled) class, not a protocol: counting under the claim lock must run no
    # Python code (see _finish).
    @property
    def stats(self) -> PurgatoryStats: ...

    def user_code_failed(self, op: OperationCore, callback: str, exc: BaseException) -> None: ...

    def operation_finished(self, op: OperationCore) -> None: ...


# Someone waiting for the outcome (the asyncio bridge); called once, after ``on_complete``.
Waiter = Callable[["OperationCore"], None]


class Watch:
    """One submission's entry in every watch list of its keys: the same object on each key.

    Kafka's watch lists hold the operation itself and drop completed ones lazily (a check of the
    key, or the reaper's purge), so a completed operation stays reachable — with its response —
    from its other keys until then (KAFKA-19389). Here the lists hold this small entry instead,
    and finishing an operation sets ``op`` to None: one store releases it from all its lists at
    once, with no lookup per key. A dict entry per key (the op as its own key, for O(1)
    removal) cost 157 of the 405 bytes a pending operation on 3 keys held (``purgatory bench
    purgatory``); a list slot per key and this entry cost about 80.

    Entries are recycled (compiled only, see ``_watchers.new_watch``): an entry lives until the
    compaction of its last list, so freeing one per request came in batches, which the cyclic
    GC's allocation count does not see as frees (it stops at 0): gen0 collections rose from ~77
    to ~235 per 100k requests at 100k/s when this entry came in. ``slots`` counts the list slots
    holding it, so the compaction that drops the last one knows the entry is free to reuse.
    """

    __slots__ = ("keys", "op", "slots")

    def __init__(self, op: OperationCore, keys: Sequence[Hashable]) -> None:
        self.op: OperationCore | None = op
        # The keys it was watched on: the lists to count its death in (``_watchers.compact_after_finish``).
        self.keys = keys
        # How many watch-list slots hold it (appends less compactions' drops).
        self.slots = 0


class Extras:
    """What only some operations need, kept off the operation until one does: the asyncio
    waiter (``DelayedOperationPurgatory.watch``) and the submission clock (set only while the
    purgatory has listeners, for the journal's latency and ids).

    Two fields of every operation cost 16 of the ~250 bytes a pending one held (``purgatory
    bench purgatory``, which, like most callers, uses neither); one field pointing here costs 8,
    and an operation that needs them pays one small object more (asyncio's future and the
    journal's events cost several).
    """

    __slots__ = ("submitted_ns", "waiter")

    def __init__(self) -> None:
        self.waiter: Waiter | None = None
        self.submitted_ns = 0


def extras_of(op: OperationCore) -> Extras:
    """``op``'s extras, made on first use. Only the thread submitting ``op`` (or awaiting it,
    before it submits) calls this, so two threads never race to make them."""
    extras = op._extras
    if extras is None:
        extras = op._extras = Extras()
    return extras


@mypyc_attr(allow_interpreted_subclasses=True)  # DelayedOperation, and users' operations
class OperationCore(TimerTask):
    """What every operation does however it is written: see :class:`purgatory.DelayedOperation`.

    Finishing is *claimed* by an atomic test-and-set that is independent of ``op.lock``: exactly
    one of ``force_complete``, expiry (``run``) and cancellation wins; the others get False.
    """

    __slots__ = (
        "_extras",
        "_keys_cancelled",
        "_lock",
        "_lock_state",
        "_owner",
        "_started_ns",
        "_watch",
        "outcome",
    )

    def __init__(self, delay_ms: object, lock: LockLike | None = None) -> None:
        # ``object``, checked here: typed ``int``, mypyc would refuse ``1.5`` with its own "int
        # object expected; got float" before this line, an error that does not name the field.
        # (Checked in DelayedOperation.__init__ before: an interpreted frame per operation.)
        ms = delay_ms if type(delay_ms) is int and 0 <= delay_ms <= MAX_DELAY_MS else _checked_delay(delay_ms)
        TimerTask.__init__(self, ms)
        # Set by cancel_for_key: the caller owns the operation now, drain must leave it alone.
        # Assigned first: mypyc lays fields out in assignment order, so this 1-byte bool shares
        # the 8-byte word of TimerTask's last field (``_scheduled``, also a bool): 8 B per op.
        self._keys_cancelled = False
        # The lock given, or None: then ``op.lock`` is the operation's own re-entrant lock, kept
        # in the two fields below (see OwnLock). A threading.RLock per operation cost 104 of the
        # 405 bytes a pending operation held (``purgatory bench purgatory``) and an allocation,
        # a semaphore init and destroy per request.
        self._lock: LockLike | None = lock
        # The own lock's state in one word: 0 when free, else the owner thread's ident
        # shifted by OWNER_SHIFT plus the re-entry depth (see OwnLock; one field, not two: 8 B).
        self._lock_state = 0
        # When last submitted, on the owner's latency clock (PurgatoryStats.now_ns): the start
        # of the latency the finish counts. 8 B per operation, read once per finish.
        self._started_ns = 0
        # None until claimed (see _finish): the claim and is_completed() both read this field.
        self.outcome: Outcome | None = None
        self._owner: OperationOwner | None = None
        # The asyncio waiter and the submission clock, when either is needed (see Extras).
        self._extras: Extras | None = None
        # This op's entry in the watch lists of its keys, so that finishing can release it from
        # all of them with one store (see Watch).
        self._watch: Watch | None = None

    # -- to implement -------------------------------------------------------------------------

    # Declared for the compiled calls below; DelayedOperation declares them abstract.
    def try_complete(self) -> bool:
        raise NotImplementedError

    def on_complete(self) -> None:
        raise NotImplementedError

    def on_expiration(self) -> None:
        """Extra work when the operation timed out (after ``on_complete``)."""

    @property
    def lock(self) -> LockLike:
        """The lock ``safe_try_complete*`` hold while ``try_complete`` runs: the one given to the
        constructor, else the operation's own re-entrant lock (:class:`OwnLock`)."""
        lock = self._lock
        if lock is None:
            # First look at the own lock from outside: give it a face, once. Two threads may both
            # build one; the guard lets only the first be kept, so ``op.lock is op.lock``.
            face = OwnLock(self)
            _guard_acquire()
            try:
                lock = self._lock
                if lock is None:
                    self._lock = lock = face
            finally:
                _guard_release()
        return lock

    @lock.setter
    def lock(self, lock: LockLike) -> None:
        self._lock = lock

    @property
    def submitted_ns(self) -> int:
        """``time.monotonic_ns()`` when last handed to a purgatory that has listeners (the start
        of the latency the journal reports), else 0."""
        extras = self._extras
        return 0 if extras is None else extras.submitted_ns

    # -- finishing ----------------------------------------------------------------------------

    def is_completed(self) -> bool:
        """True once the operation has been claimed by completion, expiry or cancellation."""
        return self.outcome is not None

    def force_complete(self) -> bool:
        """Finish as ``COMPLETED`` unless already finished; True iff this call finished it."""
        return finish(self, Outcome.COMPLETED)

    def run(self) -> None:
        """Timer expiry: finish as ``EXPIRED``, then ``on_expiration``."""
        finish(self, Outcome.EXPIRED)

    def _expire(self) -> bool:
        return finish(self, Outcome.EXPIRED)

    def _cancel_operation(self) -> bool:
        """Finish as ``CANCELLED`` (the awaiting asyncio task was cancelled)."""
        return finish(self, Outcome.CANCELLED)

    # -- locked checks ------------------------------------------------------------------------

    def safe_try_complete(self) -> bool:
        """Under ``op.lock``: False if already finished, else ``try_complete()``."""
        return safe_try_complete(self)

    def safe_try_complete_or_else(self, action: Callable[[], None]) -> bool:
        """Under ``op.lock``: ``try_complete()``; if False run ``action()`` and try once more."""
        given = self._lock
        if given is None or type(given) is OwnLock:
            me = _thread_id()
            own_acquire_as(self, me, True, -1.0)
            try:
                if self.try_complete():
                    return True
                action()
                return self.try_complete()
            finally:
                own_release_as(self, me)
        with given:
            if self.try_complete():
                return True
            action()
            return self.try_complete()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(delay_ms={self.delay_ms}, outcome={self.outcome})"


# The finishing path as module-level functions, not methods. Compiled code calls a method of a
# class that allows interpreted subclasses through Python-level dispatch (a subclass written in
# Python might override it: PyObject_VectorcallMethod, argument parsing, a type check), but a
# module-level function directly. Submit and finish used to make six such calls per request.


def _checked_delay(delay_ms: object) -> int:
    """``delay_ms`` if it is a valid delay (an int subclass, say), else a typed error naming it."""
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int):
        raise TypeError(f"delay_ms must be an int number of milliseconds, got {delay_ms!r}")
    if delay_ms < 0 or delay_ms > MAX_DELAY_MS:
        raise ValueError(f"delay_ms must be from 0 to {MAX_DELAY_MS} milliseconds, got {delay_ms!r}")
    return delay_ms


def is_finished(op: OperationCore) -> bool:
    """``op.is_completed()`` for compiled callers (a call also keeps mypy from narrowing the field)."""
    return op.outcome is not None


def safe_try_complete(op: OperationCore) -> bool:
    """Under ``op.lock``: False if already finished, else ``try_complete()``."""
    given = op._lock
    if given is None or type(given) is OwnLock:
        me = _thread_id()
        own_acquire_as(op, me, True, -1.0)
        try:
            if op.outcome is not None:
                return False
            return op.try_complete()
        finally:
            own_release_as(op, me)
    with given:
        if op.outcome is not None:
            return False
        return op.try_complete()


# -- the operation's own lock ------------------------------------------------------------------


class OwnLock:
    """An operation's default ``op.lock``: a re-entrant lock whose state lives in the operation.

    It behaves as ``threading.RLock`` (the thread holding it may acquire it again and must
    release it as often; ``acquire(blocking, timeout)``; releasing a lock this thread does not
    hold raises RuntimeError; ``threading.Condition`` can be built on it), but costs no object
    per operation: the owner's thread ident and the depth share one field of the operation
    (``_lock_state``), so an operation whose lock only the purgatory takes
    never allocates one. This object is only a face, made the first time someone reads
    ``op.lock``; the purgatory itself calls ``own_acquire``/``own_release`` directly.

    Concurrency: every change of an own lock's state happens under one process-wide guard
    (``_OWN_LOCKS_GUARD``), held for a few steps that run no user code. A thread that finds the
    lock taken waits on the guard's condition, which each release that leaves a lock free
    notifies while anyone waits: one condition for all operations is enough because an
    operation's lock is held only while ``try_complete`` runs, and contention on one is rare.
    (tests/core/test_delayed_operation.py::test_own_lock_*)
    """

    __slots__ = ("_op",)

    def __init__(self, op: OperationCore) -> None:
        self._op = op

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return own_acquire(self._op, blocking, float(timeout))

    def release(self) -> None:
        own_release(self._op)

    def __enter__(self) -> bool:
        return own_acquire(self._op, True, -1.0)

    def __exit__(self, *exc: object) -> None:
        own_release(self._op)

    def locked(self) -> bool:
        return self._op._lock_state != 0

    # What threading.Condition uses of an RLock, so a Condition built on op.lock waits correctly
    # when this thread holds it more than once.
    def _is_owned(self) -> bool:
        return self._op._lock_state >> OWNER_SHIFT == _thread_id()

    def _release_save(self) -> int:
        op = self._op
        _guard_acquire()
        try:
            state = op._lock_state
            if state >> OWNER_SHIFT != _thread_id():
                raise RuntimeError("cannot release un-acquired lock")
            op._lock_state = 0
            _OWN_LOCK_RELEASED.notify_all()
            return state
        finally:
            _guard_release()

    def _acquire_restore(self, state: int) -> None:
        op = self._op
        own_acquire(op, True, -1.0)
        op._lock_state = state  # the same owner (this thread), the depth it had

    def __repr__(self) -> str:
        state = self._op._lock_state
        owner, depth = state >> OWNER_SHIFT, state & ((1 << OWNER_SHIFT) - 1)
        status = "unlocked" if state == 0 else f"locked by thread {owner} x{depth}"
        return f"<OwnLock of {type(self._op).__name__} {status}>"


def own_acquire(op: OperationCore, blocking: bool, timeout: float) -> bool:
    """Take ``op``'s own lock (see OwnLock); False if not blocking, or timed out, and taken."""
    return own_acquire_as(op, _thread_id(), blocking, timeout)


def own_acquire_as(op: OperationCore, me: int, blocking: bool, timeout: float) -> bool:
    """:func:`own_acquire` for a caller that has this thread's ident ``me`` already.

    The purgatory's own acquire/release pairs read the ident once for both: ``get_ident()``
    returns a new int object on every call (pthread_self is above the small-int cache)."""
    if _NATIVE_STEPS:
        # No call between each read and its write: atomic under the GIL (see _NATIVE_STEPS).
        if _own_take(op, me):
            return True
        if not blocking:
            return False
    _guard_acquire()
    try:
        if _own_take(op, me):
            return True
        if not blocking:
            return False
        return _own_acquire_contended(op, me, timeout)
    finally:
        _guard_release()


def _own_take(op: OperationCore, me: int) -> bool:
    """Take ``op``'s own lock if it is free or already ``me``'s (one more level); False if not.
    Atomic only where its caller makes it so: compiled (no call between the read and the write)
    or under the guard."""
    state = op._lock_state
    if state == 0:
        op._lock_state = (me << OWNER_SHIFT) | 1
        return True
    if state >> OWNER_SHIFT == me:
        if state & DEPTH_MAX == DEPTH_MAX:
            raise OverflowError(f"an operation's own lock taken {DEPTH_MAX} times over by one thread")
        op._lock_state = state + 1
        return True
    return False


def _own_acquire_contended(op: OperationCore, me: int, timeout: float) -> bool:
    # Caller holds the guard; Condition.wait releases it while waiting and takes it back.
    released = _OWN_LOCK_RELEASED
    waiting = _WAITING
    deadline = time.monotonic() + timeout if timeout >= 0 else 0.0
    waiting.count += 1
    try:
        while op._lock_state != 0:
            if timeout < 0:
                released.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                released.wait(remaining)
    finally:
        waiting.count -= 1
    op._lock_state = (me << OWNER_SHIFT) | 1
    return True


def own_release(op: OperationCore) -> None:
    """Release ``op``'s own lock once; RuntimeError if this thread does not hold it."""
    own_release_as(op, _thread_id())


def own_release_as(op: OperationCore, me: int) -> None:
    """:func:`own_release` for a caller that has this thread's ident ``me`` (see own_acquire_as)."""
    if _NATIVE_STEPS:
        # Only the holder changes a held lock's state, and the store of 0 is one native step.
        # No wake-up is lost: a waiter counts itself in _WAITING before it reads the state, and
        # this reads the count after storing 0; its notify waits for the guard, which the waiter
        # gives up only once registered on the condition.
        state = op._lock_state
        if state >> OWNER_SHIFT != me:
            raise RuntimeError("cannot release un-acquired lock")
        state -= 1
        if state & ((1 << OWNER_SHIFT) - 1) == 0:
            state = 0
        op._lock_state = state
        if state == 0 and _WAITING.count:
            _guard_acquire()
            try:
                _OWN_LOCK_RELEASED.notify_all()
            finally:
                _guard_release()
        return
    _guard_acquire()
    try:
        state = op._lock_state
        if state >> OWNER_SHIFT != me:
            raise RuntimeError("cannot release un-acquired lock")
        state -= 1
        if state & ((1 << OWNER_SHIFT) - 1) == 0:
            state = 0
        op._lock_state = state
        # Threads waiting for any own lock wait on this one condition: wake them to look.
        if state == 0 and _WAITING.count:
            _OWN_LOCK_RELEASED.notify_all()
    finally:
        _guard_release()


def _claim(op: OperationCore, outcome: Outcome, stats: PurgatoryStats | None, now_ns: int) -> bool:
    """The claim's test-and-set and the owner's counts: native steps only (see :func:`finish`)."""
    if op.outcome is not None:
        return False
    op.outcome = outcome
    if stats is not None:
        stats.count(outcome, now_ns - op._started_ns)
    return True


def finish(op: OperationCore, outcome: Outcome) -> bool:
    """Claim ``op`` for ``outcome`` and, if this call won the claim, run its callbacks."""
    # The claim: test-and-set of ``outcome``; interpreted, under one process-wide lock. A Lock per
    # operation would cost an allocation and ~40 bytes each (purgatory bench: 0.3 us per
    # request); the critical section is a few bytecodes, so sharing it costs no parallelism
    # under the GIL. The owner's outcome counters ride on the same lock.
    # Nothing under this lock may run Python code (compiled, these are all native calls):
    # a thread switch while holding it parks every other finishing thread on the lock, and
    # each then waits a GIL switch interval (5 ms) to get going again. With the counters
    # counted through a Python method here, expiry bursts on the executor convoyed with the
    # completing threads until requests expired faster than they completed (2 in 5 runs of
    # ``purgatory bench purgatory`` ended with 40-70k of 100k requests expired, not ~4.6k).
    # acquire/release rather than ``with``: compiled, ``with`` also looks up and calls
    # ``__enter__``/``__exit__`` through the generic protocol (see WheelTimerCore.schedule).
    # The latency clock is read before the claim: a MockTimer's clock is Python code, which must
    # not run inside it. (One clock read per finish attempt; the losers' are wasted, and rare.)
    # ``stats`` read once here: through the owner protocol, a generic attribute lookup.
    owner = op._owner
    stats = owner.stats if owner is not None else None
    now_ns = stats.now_ns() if stats is not None else 0
    if _NATIVE_STEPS:
        # Compiled, the claim needs no lock: the test, the store and the counting run no Python
        # code (native field reads and writes, the owner's ``stats`` slot, PurgatoryStats.count,
        # all compiled), so no other thread runs between the test and the store — the GIL
        # changes hands only in the interpreter loop (see _NATIVE_STEPS; the own lock's steps
        # rely on the same). The lock's acquire and release were two calls of a method that
        # parses its arguments (``lock.acquire``: PyArg_ParseTupleAndKeywords) per finish.
        # (tests/core/test_concurrency.py: finishes racing on many threads, each claimed once.)
        if not _claim(op, outcome, stats, now_ns):
            return False
    else:
        _claim_acquire()
        try:
            if not _claim(op, outcome, stats, now_ns):
                return False
        finally:
            _claim_release()
    # The winner removes the timer entry so the wheel frees it now rather than at expiry.
    cancel_task(op)
    try:
        op.on_complete()
    except Exception as exc:
        # The operation is finished all the same: its outcome is set and it will not run again.
        _report(op, "on_complete", exc)
    if outcome is Outcome.EXPIRED:
        try:
            op.on_expiration()
        except Exception as exc:
            _report(op, "on_expiration", exc)
    # Observers hear of the finish only once every callback has run, so an awaiting caller
    # never sees the outcome before on_expiration's side effects.
    if owner is not None:
        owner.operation_finished(op)
    # Taken, not just read: the waiter is called once, and the op must not keep it afterwards. An
    # asyncio waiter's closure holds the awaiting call's environment, which holds the op: kept,
    # every finished request-reply op was a reference cycle (14 objects) left to the cyclic GC,
    # whose collections then stalled the requester for tens to hundreds of ms on a busy machine.
    extras = op._extras
    waiter: Waiter | None = None
    if extras is not None:
        waiter = extras.waiter
        extras.waiter = None
    if waiter is not None:
        # A waiter can fail too (its event loop closed with the task still pending: "Event
        # loop is closed"). The op is finished all the same, and the failure must not escape
        # into the finishing thread — inside shutdown's drain it stopped the drain, leaving
        # later operations unfinished (tests/tools/test_faults.py, closed event loop).
        try:
            waiter(op)
        except Exception as exc:
            _report(op, "waiter", exc)
    return True


def _report(op: OperationCore, callback: str, exc: BaseException) -> None:
    owner = op._owner
    if owner is not None:
        owner.user_code_failed(op, callback, exc)
    else:
        _log.error("user_callback_failed", callback=callback, operation=type(op).__name__, exc_info=exc)
