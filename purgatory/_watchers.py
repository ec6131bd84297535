"""Watchers and WatcherList: which operations wait on which key, sharded to spread lock contention."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Final

from mypy_extensions import i64

from . import _accel
from ._operation_core import OperationCore, Watch, is_finished

__all__ = [
    "SHARDS",
    "Watch",
    "WatcherList",
    "Watchers",
    "compact_after_finish",
    "keys_not_holding",
    "new_watch",
    "pooled_watch_entries",
    "release_watch",
    "shard_index",
    "watch",
]

# Kafka's figure: shard the watcher lists so threads on different keys rarely contend. Final:
# compiled code reads it as a constant, not from the module's dict (twice per key per request).
SHARDS: Final = 512
# SHARDS is a power of 2, so a key's shard is the low bits of its hash: one native AND (see
# shard_index). For every Python int x, x & (2**k - 1) == x % 2**k, negative ones included, so
# keys land in the shards ``hash(key) % SHARDS`` chose (tests/core/test_kafka_regressions.py
# builds keys that share one shard that way).
SHARD_MASK: Final = SHARDS - 1

# A list is compacted once at least half of its entries are dead (their operation finished or
# was unwatched): each compaction of n entries follows n/2 deaths, so O(1) per death amortised,
# and a list never holds more than twice its live entries (plus what was appended meanwhile).
COMPACT_DEAD_FRACTION: Final = 2

# Released watch entries kept for reuse (see Watch): a request then allocates no entry and the
# compaction frees none, so the GC's allocation count stays level. Bounded: a burst of finishes
# must not pin its entries for ever.
#
# Why no one ever reaches an operation through a recycled entry — the invariant every list keeps:
# *a watch list holds an entry only while the entry is its submission's*: the entry's ``op`` is
# the operation watched on that list's key, or None (released), never another operation.
#   - Into the pool only from no list: ``slots`` counts the lists holding the entry, and the
#     compaction that drops the last one pools it only *after* its slice assignment has taken
#     the entry out (``_compact_locked``). A list that has not dropped it keeps it from the pool.
#   - Onto a list only by its own submission: ``watch`` appends only if ``entry.op`` is still
#     its op, read in the same native step as the append. A submitter that lost the GIL before
#     the append (a key's ``__hash__``, a collection) while its op was finished, released,
#     dropped from its lists and the entry handed to another op, appends nothing.
#   - Readers read ``entry.op`` while a list holds the entry: under the shard lock (every drop
#     from a list takes it: ``all_ops``, compaction), or in one native sweep of the live list
#     with nothing in between that can switch threads (``_live_ops``). A reader that copied a
#     list and read the entries' ops later could read a recycled entry: with the copy
#     (``ops[:]``) then ``out = []`` (a collection, whose callbacks switch threads), an op was
#     tried by a key event of a key it was not watched on, in another purgatory even
#     (tests/core/test_watch_recycling.py::test_recycled_entries_never_reach_*).
# "The same native step" holds compiled only (mypyc: no call into Python code between two
# native reads/writes and a list append, so the GIL stays with this thread, as _operation_core's
# _NATIVE_STEPS). Interpreted, a thread switch may fall between any two bytecodes, so entries are
# never recycled: allocated per submission and freed by the compaction, as before.
_RECYCLE: Final = _accel.compiled()
_POOL: Final[list[Watch]] = []
POOL_MAX: Final = 16384


class Watchers:
    """The entries watched on one key, in watch order: an append-only list (Kafka: a
    ConcurrentLinkedQueue), compacted in place when half of it is dead.

    Appending needs no lock (``list.append`` is atomic). Compaction rewrites the prefix it
    examined in one C-level slice assignment, so entries appended meanwhile (at the end) are
    kept; compactions of one list are serialised by the shard lock. ``dead`` counts entries known
    dead since the last compaction: a heuristic for when to compact (a lost update from racing
    threads only delays one), never a figure anyone reads as exact.
    """

    __slots__ = ("dead", "key", "ops")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.ops: list[Watch] = []
        self.dead = 0

    def live(self) -> int:
        """Entries whose operation is still watched here (finished-but-unpurged ones included)."""
        return len(_live_ops(self))


class WatcherList:
    """One shard: key -> :class:`Watchers`, and the lock for its compound updates.

    Watching is lock-free (it runs for every key of every request; the locks were a quarter of
    the submit path in ``purgatory bench purgatory``). The lock serialises compactions, the
    *removal of a key* (when its list empties) and ``cancel``. The race it leaves is this story:

    1. thread_a (watch) reads ``watchers_by_key[key]`` -> W
    2. thread_b (compact) empties W and, under the lock, removes ``key`` -> W is orphaned
    3. thread_a appends to W — which no key event will ever look at again

    So a watcher re-reads the mapping after appending and, if it no longer points at W, appends
    to the current Watchers (its entry in the orphan is garbage with it). Removal checks
    emptiness under the lock and only removes the Watchers it saw, so a key is never removed
    with an entry appended before the check, and one appended after it is caught by the
    watcher's re-read. (tests/core/test_concurrency.py and tests/core/test_kafka_regressions.py
    attack this; tests/core/test_watchers_snapshot.py the compaction's copy.)
    Never held while user code runs: ``try_complete`` may re-enter the purgatory on the same key
    (KAFKA-3994 was a deadlock from doing otherwise).
    """

    __slots__ = ("lock", "watchers_by_key")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchers_by_key: dict[Hashable, Watchers] = {}

    # Below, every iteration runs over a snapshot taken by one C call (``_copy``, ``dict.copy()``,
    # ``list(d.values())``): watchers append lock-free, and a copy that allocates per item
    # (``list(d.items())``) can start a GC, whose Python code (gc.callbacks, weakref callbacks,
    # __del__) may hand the GIL to a watcher mid-copy — "dictionary changed size during
    # iteration" in the reaper, 1 purge in ~10 under ``purgatory bench purgatory`` with its GC
    # meter (tests/core/test_watchers_snapshot.py).

    def snapshot(self, key: Hashable) -> list[OperationCore]:
        watchers = self.watchers_by_key.get(key)
        return [] if watchers is None else _live_ops(watchers)

    def cancel(self, key: Hashable) -> list[OperationCore]:
        with self.lock:
            watchers = self.watchers_by_key.pop(key, None)
        if watchers is None:
            return []
        return [op for op in _live_ops(watchers) if not is_finished(op)]

    def compact(self, watchers: Watchers) -> int:
        """Drop the released and finished entries of ``watchers``; drop its key if none is left.
        Returns how many held a finished operation."""
        with self.lock:
            return _compact_locked(self, watchers, True)

    def compact_released(self, watchers: Watchers) -> None:
        """Drop the released entries of ``watchers`` (the compaction after a finish, see
        :func:`compact_after_finish`); drop its key if none is left."""
        with self.lock:
            _compact_locked(self, watchers, False)

    def purge_completed(self) -> int:
        purged = 0
        with self.lock:
            for watchers in list(self.watchers_by_key.copy().values()):
                purged += _compact_locked(self, watchers, True)
        return purged

    def count_watched(self) -> int:
        return sum(w.live() for w in list(self.watchers_by_key.values()))

    def all_ops(self) -> list[OperationCore]:
        with self.lock:
            return [op for w in list(self.watchers_by_key.values()) for op in _live_ops(w)]


def _live_ops(watchers: Watchers) -> list[OperationCore]:
    """The operations of the entries ``watchers`` holds, in order, read as the invariant above
    asks: compiled, in one native sweep of the live list (``out`` is allocated first, so a
    collection it starts runs before any entry is read; appending to it allocates no object);
    interpreted, from a copy taken by one C call (:func:`_copy`; no recycling there; watchers
    append meanwhile)."""
    out: list[OperationCore] = []
    if _RECYCLE:
        for entry in watchers.ops:
            op = entry.op
            if op is not None:
                out.append(op)
        return out
    for entry in _copy(watchers.ops):
        op = entry.op
        if op is not None:
            out.append(op)
    return out


def _copy(ops: list[Watch]) -> list[Watch]:
    """A copy of a live list that may shrink meanwhile, taken as ``list(ops)``, never ``ops[:]``.

    CPython's slice (``list_slice``; ``ops.copy()`` too) takes the length, *then* allocates the
    copy, then copies that many items from the list's current array. The allocation can start a
    GC, the GC run Python code (gc.callbacks, weakref callbacks, ``__del__``), and that code hand
    the GIL to a compaction of the same list (``ops[:n] = kept``), which shrinks it and may
    reallocate its array: the slice then copies — and increfs — past the end, freed memory (a
    segfault in ``_live_ops``, once in a CI run of tests/core/test_concurrency.py, pure Python;
    tests/core/test_watchers_snapshot.py::test_a_copy_survives_a_compaction_a_gc_runs_inside_it).
    ``list(ops)`` allocates the new list first and reads the length after, and growing it
    (``PyMem_Realloc``) starts no GC: nothing runs between the length read and the copy.
    """
    return list(ops)


def _compact_locked(shard: WatcherList, watchers: Watchers, finished_too: bool) -> int:
    """Drop released entries, and with ``finished_too`` the entries of finished operations not
    yet released; return how many of those it dropped (the released ones are bookkeeping: their
    operation left at its finish). Caller holds the lock.

    Without ``finished_too`` (the compaction a finish starts) an entry still holding its op is
    kept without reading the op: every finish releases its entry (``operation_finished``), so a
    finished-but-held entry is one whose finisher is about to, and the next compaction or the
    reaper's purge drops it. Reading ``op.outcome`` there touched every live operation of the
    list (half its entries: tens of thousands of cold objects per pass on the three keys every
    request of ``purgatory bench purgatory`` shares, issue 15), for entries almost never dropped."""
    # Only the prefix examined is rewritten, in one C-level slice assignment: entries appended
    # by lock-free watchers meanwhile sit after it and stay.
    ops = watchers.ops
    # A slice is safe here (see _copy): under the shard lock no one else shrinks the list, and
    # what watchers append meanwhile only grows it past the length the slice read.
    examined = ops[:]
    kept: list[Watch] = []
    freed: list[Watch] = []
    lingering = 0
    for entry in examined:
        op = entry.op
        if op is not None and (not finished_too or not is_finished(op)):
            kept.append(entry)
            continue
        # Dropped here. Compiled, the read and the write of ``slots`` are one native step.
        slots = entry.slots - 1
        entry.slots = slots
        if op is not None:
            # Finished, not yet released by its finisher (``entry.op = None``): not recycled.
            lingering += 1
        elif _RECYCLE and slots == 0:
            freed.append(entry)
    watchers.dead = 0
    ops[: len(examined)] = kept
    # Pooled only now that this list no longer holds them (see _RECYCLE's invariant): pooled in
    # the loop, an entry sat in the pool and on this list while the slice assignment allocated.
    if freed and len(_POOL) < POOL_MAX:
        for entry in freed:
            # A pooled entry must not keep its last op's keys alive (user objects, held for as
            # long as the entry waits for reuse). No one reads them now: the finisher read them
            # before its release, and no list holds the entry.
            entry.keys = ()
        _POOL.extend(freed)
    if not ops:
        _remove_emptied(shard, watchers)
    return lingering


def _remove_emptied(shard: WatcherList, watchers: Watchers) -> None:
    """Drop the key of ``watchers``, which the caller (under the shard lock) just emptied.

    Removed first, then looked at: a lock-free watcher appends, then checks that the dict still
    holds the list (``watch``). Checked first and removed after (as before), an append and its
    check could both fall between the two (a key's ``__hash__`` is Python code, a thread switch),
    leaving the entry on a list no key event finds: a lost completion (the pure run of
    tests/core/test_watch_recycling.py's stress). Now an append either precedes the removal, and
    is seen here and put back, or follows it, and its check sends it to the key's new list."""
    by_key = shard.watchers_by_key
    key = watchers.key
    if by_key.get(key) is not watchers:
        return  # only the Watchers we emptied: see WatcherList's story
    del by_key[key]
    if watchers.ops:
        # Appended meanwhile: the list goes back, or its entries join the list a watcher made
        # since (a duplicate entry only makes a check try the op twice).
        current = by_key.setdefault(key, watchers)
        if current is not watchers:
            current.ops.extend(watchers.ops)


# Module-level functions, not methods: compiled code calls a function of this module directly.
#
# Key loops: the per-request loops over an operation's keys are written once per concrete type,
# list and tuple (what submissions pass, and what the entry keeps), with the body a function.
# Compiled, ``for key in keys`` over a ``Sequence`` goes through the generic iterator protocol
# (an allocated iterator, a call per item: ~250-420 instructions per loop, three loops per request
# in the bench's callgrind driver); over a ``list`` or a ``tuple`` it is an indexed loop.


def shard_index(key: Hashable) -> i64:
    """The shard of ``key``: ``hash(key) % SHARDS``, computed natively.

    Compiled, ``hash(key) % SHARDS`` boxed the hash whenever it did not fit mypyc's 63-bit short
    int (half of all hashes) and took Python's long modulo on it (``l_mod``, ``PyNumber_Remainder``:
    ~3.5% of a request's CPU in a profile of the bench's per-request work, three times per request
    per key). As an ``i64`` the hash is unboxed once and masked in one instruction."""
    h: i64 = hash(key)
    return h & SHARD_MASK


def new_watch(op: OperationCore, keys: Sequence[Hashable]) -> Watch:
    """An entry for ``op`` watched on ``keys``: a pooled one if any (see Watch), else a new one.

    A pooled entry is on no list and its op is None, and only a finisher of *its* op stores to
    it (``release_watch`` checks whose it is), so handing it to another op is safe."""
    if _RECYCLE and _POOL:
        try:
            entry = _POOL.pop()
        except IndexError:  # emptied by another thread since the test (not compiled: no switch)
            return Watch(op, keys)
        entry.op = op
        entry.keys = keys
        return entry
    return Watch(op, keys)


def pooled_watch_entries() -> int:
    """How many finished entries the pool keeps for reuse (at most ``POOL_MAX``): memory kept by
    design, bounded, which a leak check must not count (tools/reliability/_soak.py)."""
    return len(_POOL)


def release_watch(entry: Watch, op: OperationCore) -> None:
    """Release ``op`` from every list holding ``entry`` — unless the entry has moved on: once
    released (by another path of the same finish) it may have been recycled for another op."""
    if entry.op is op:
        entry.op = None


def watch(shards: list[WatcherList], op: OperationCore, keys: Sequence[Hashable], entry: Watch) -> None:
    """Append ``entry`` (``op``'s) to the lists of ``keys`` in order, lock-free. Stops early once
    ``op`` has finished: a key event on an already-watched key may finish it. WatcherList's
    docstring tells the race the re-read closes.
    """
    # One loop per concrete type (the note on key loops above shard_index); the body: _watch_key.
    if isinstance(keys, list):  # noqa: SIM114 - the same body, compiled for each type
        for key in keys:
            if not _watch_key(shards, op, key, entry):
                return
    elif isinstance(keys, tuple):
        for key in keys:
            if not _watch_key(shards, op, key, entry):
                return
    else:
        for key in keys:
            if not _watch_key(shards, op, key, entry):
                return


def _watch_key(shards: list[WatcherList], op: OperationCore, key: Hashable, entry: Watch) -> bool:
    """:func:`watch`'s step for one key; False: stop (``op`` finished, or its entry moved on)."""
    if is_finished(op):  # a call: a narrowed field re-read would be type-checked by mypyc
        return False
    by_key = shards[shard_index(key)].watchers_by_key
    while True:
        watchers = by_key.get(key)
        if watchers is None:
            watchers = by_key.setdefault(key, Watchers(key))
        ops = watchers.ops
        # From this read to the append, one native step (see _RECYCLE's invariant): the
        # entry is still ``op``'s, so no other op's submission can hold it.
        held = entry.op
        if held is not op:
            return False  # finished and released meanwhile; the entry may be another op's now
        # A key given twice is watched once (as with a dict entry per key): the entry is
        # then at the tail already, unless another submission appended in between (a
        # duplicate entry only makes a check try the op twice, the second try a no-op).
        if not ops or ops[-1] is not entry:
            entry.slots += 1
            ops.append(entry)
        if by_key.get(key) is watchers:
            return True


def keys_not_holding(shards: list[WatcherList], keys: Sequence[Hashable], entry: Watch) -> list[Hashable]:
    """The ``keys`` whose lists do not hold ``entry`` (an O(n) scan per key: only for an op
    submitted again after ``cancel_for_key``, whose entry may still be on its other keys)."""
    missing: list[Hashable] = []
    for key in keys:
        watchers = shards[shard_index(key)].watchers_by_key.get(key)
        if watchers is None or entry not in _copy(watchers.ops):
            missing.append(key)
    return missing


def compact_after_finish(shards: list[WatcherList], keys: Sequence[Hashable]) -> None:
    """Count a released entry's death in the lists of its ``keys`` (read before the release:
    the entry may be recycled for another op from then on); compact those now half dead."""
    # One loop per concrete type (the note on key loops above shard_index); the body: _count_death.
    if isinstance(keys, list):  # noqa: SIM114 - the same body, compiled for each type
        for key in keys:
            _count_death(shards, key)
    elif isinstance(keys, tuple):
        for key in keys:
            _count_death(shards, key)
    else:
        for key in keys:
            _count_death(shards, key)


def _count_death(shards: list[WatcherList], key: Hashable) -> None:
    shard = shards[shard_index(key)]
    watchers = shard.watchers_by_key.get(key)
    if watchers is not None:
        dead = watchers.dead + 1
        watchers.dead = dead
        if dead * COMPACT_DEAD_FRACTION >= len(watchers.ops):
            shard.compact_released(watchers)
