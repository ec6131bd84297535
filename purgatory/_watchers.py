"""Watchers and WatcherList: which operations wait on which key, sharded to spread lock contention."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence

from ._operation_core import OperationCore, is_finished

__all__ = ["SHARDS", "WatcherList", "Watchers", "entry_key", "unwatch", "watch"]

SHARDS = 512  # Kafka's figure: shard the watcher lists so threads on different keys rarely contend

# Operation class -> whether its instances hash and compare by identity (filled on first use).
_IDENTITY_HASHED: dict[type, bool] = {}


def entry_key(op: OperationCore) -> object:
    """The key of ``op``'s entry in every ``Watchers.ops`` dict: the op itself, or ``id(op)``.

    An op whose class keeps ``object``'s identity ``__hash__`` and ``__eq__`` (every op unless its
    class redefines them, a dataclass say) is its own key: nothing allocated. ``id(op)`` was an int
    boxed at each insert, three per request on three keys: 96 of the 509 bytes a pending operation
    cost (``purgatory bench purgatory``, bytes per pending op) and three allocations per submit.
    An op comparing by value cannot be its own key (two equal ops would share one entry), so it
    keeps ``id(op)``, boxed once per call. The two kinds never collide: an int and an
    identity-compared op are never equal.
    """
    cls = type(op)
    identity = _IDENTITY_HASHED.get(cls)
    if identity is None:
        identity = _compares_by_identity(cls)
        _IDENTITY_HASHED[cls] = identity
    return op if identity else id(op)


def _compares_by_identity(cls: type) -> bool:
    hash_method: object = getattr(cls, "__hash__", None)
    eq_method: object = getattr(cls, "__eq__", None)
    return hash_method is object.__hash__ and eq_method is object.__eq__


class Watchers:
    """The operations watched on one key, in watch order.

    A dict keyed by :func:`entry_key` (the op, or ``id(op)``) gives O(1) removal while keeping
    insertion order (Kafka uses a
    ConcurrentLinkedQueue, also lock-free for add and remove). Single inserts and pops need no
    lock: each dict operation is atomic (under the GIL, and in free-threaded CPython where dicts
    lock themselves). See :class:`WatcherList` for the one race that needs care.
    """

    __slots__ = ("key", "ops")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.ops: dict[object, OperationCore] = {}


class WatcherList:
    """One shard: key -> :class:`Watchers`, and the lock for its compound updates.

    Watching and unwatching one op are lock-free (they run for every key of every request; the
    locks were a quarter of the submit path in ``purgatory bench purgatory``). The lock serialises
    only the *removal of a key* (when its Watchers empties, in purge and in cancel) and snapshots.
    The race it leaves is this story:

    1. thread_a (watch) reads ``watchers_by_key[key]`` -> W
    2. thread_b (unwatch) empties W and, under the lock, removes ``key`` -> W is orphaned
    3. thread_a adds op to W — which no key event will ever look at again

    So a watcher re-reads the mapping after inserting and, if it no longer points at W, moves
    its op to the current Watchers. Watching and unwatching run on every request, so they are
    the module functions ``watch`` and ``unwatch`` below, one call per operation over all its
    keys, the one implementation of each: a method call per key was 20% of the submit path
    (3 keys). Removal
    checks emptiness under the lock and only removes the Watchers it saw, so a key is never
    removed with an op inserted before the check, and one inserted after it is caught by the
    watcher's re-read.
    (tests/core/test_concurrency.py and tests/core/test_kafka_regressions.py attack this.)
    Never held while user code runs: ``try_complete`` may re-enter the purgatory on the same key
    (KAFKA-3994 was a deadlock from doing otherwise).
    """

    __slots__ = ("lock", "watchers_by_key")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchers_by_key: dict[Hashable, Watchers] = {}

    def drop_if_empty(self, watchers: Watchers) -> None:
        with self.lock:
            # Only the Watchers we emptied, and only if still empty: see the story above.
            if not watchers.ops and self.watchers_by_key.get(watchers.key) is watchers:
                del self.watchers_by_key[watchers.key]

    def snapshot(self, key: Hashable) -> list[OperationCore]:
        with self.lock:
            watchers = self.watchers_by_key.get(key)
            return [] if watchers is None else list(watchers.ops.values())

    def cancel(self, key: Hashable) -> list[OperationCore]:
        with self.lock:
            watchers = self.watchers_by_key.pop(key, None)
        if watchers is None:
            return []
        return list(watchers.ops.values())

    # Below, every iteration runs over a snapshot taken by one C call: watchers insert lock-free,
    # and iterating a live dict while Python code runs (``is_completed``) could see it change
    # size. The snapshot is ``dict.copy()`` or ``list(d.values())``, never ``list(d.items())``:
    # building the item tuples allocates, an allocation can start a GC, and a GC runs Python code
    # (gc.callbacks, weakref callbacks, __del__) that may hand the GIL to a watcher mid-copy —
    # "dictionary changed size during iteration" in the reaper, 1 purge in ~10 under
    # ``purgatory bench purgatory`` with its GC meter (tests/core/test_watchers_snapshot.py).

    def purge_completed(self) -> int:
        purged = 0
        with self.lock:
            for key, watchers in self.watchers_by_key.copy().items():
                ops = watchers.ops
                for entry, op in ops.copy().items():
                    if op.is_completed():
                        ops.pop(entry, None)
                        purged += 1
                if not ops:
                    del self.watchers_by_key[key]
        return purged

    def count_watched(self) -> int:
        return sum(len(w.ops) for w in list(self.watchers_by_key.values()))

    def all_ops(self) -> list[OperationCore]:
        with self.lock:
            return [op for w in list(self.watchers_by_key.values()) for op in list(w.ops.values())]


# Module-level functions, not methods: compiled code calls a function of this module directly.


def watch(shards: list[WatcherList], op: OperationCore, keys: Sequence[Hashable]) -> int:
    """Watch ``op`` on ``keys`` in order, lock-free; return how many keys it was watched on.

    Stops early once ``op`` has finished: a key event on an already-watched key may finish it.
    WatcherList's docstring tells the race the re-read closes.
    """
    op_entry = entry_key(op)
    watched = 0
    for key in keys:
        if is_finished(op):  # a call: a narrowed field re-read would be type-checked by mypyc
            break
        by_key = shards[hash(key) % SHARDS].watchers_by_key
        while True:
            watchers = by_key.get(key)
            if watchers is None:
                watchers = by_key.setdefault(key, Watchers(key))
            watchers.ops[op_entry] = op
            if by_key.get(key) is watchers:
                break
            watchers.ops.pop(op_entry, None)
        watched += 1
    return watched


def unwatch(shards: list[WatcherList], op: OperationCore, keys: Sequence[Hashable]) -> None:
    op_entry = entry_key(op)
    for key in keys:
        shard = shards[hash(key) % SHARDS]
        watchers = shard.watchers_by_key.get(key)
        if watchers is not None:
            ops = watchers.ops
            ops.pop(op_entry, None)  # lock-free; only removing the key takes the shard lock
            if not ops:
                shard.drop_if_empty(watchers)
