"""Watchers and WatcherList: which operations wait on which key, sharded to spread lock contention."""

from __future__ import annotations

import threading
from collections.abc import Hashable

from ._operation import DelayedOperation

__all__ = ["SHARDS", "WatcherList", "Watchers"]

SHARDS = 512  # Kafka's figure: shard the watcher lists so threads on different keys rarely contend


class Watchers:
    """The operations watched on one key, in watch order.

    A dict keyed by ``id(op)`` gives O(1) removal while keeping insertion order (Kafka uses a
    ConcurrentLinkedQueue). Guarded by the lock of the :class:`WatcherList` that holds it.
    """

    __slots__ = ("key", "ops")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.ops: dict[int, DelayedOperation] = {}


class WatcherList:
    """One shard: key -> :class:`Watchers`, with the lock that guards the map and every Watchers in it.

    The lock is held only for dict operations, never while user code runs: ``try_complete`` may
    re-enter the purgatory on the same key (KAFKA-3994 was a deadlock from doing otherwise).
    """

    __slots__ = ("lock", "watchers_by_key")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchers_by_key: dict[Hashable, Watchers] = {}

    def watch(self, key: Hashable, op: DelayedOperation) -> None:
        with self.lock:
            watchers = self.watchers_by_key.get(key)
            if watchers is None:
                watchers = self.watchers_by_key[key] = Watchers(key)
            watchers.ops[id(op)] = op

    def unwatch(self, key: Hashable, op: DelayedOperation) -> None:
        with self.lock:
            watchers = self.watchers_by_key.get(key)
            if watchers is not None:
                watchers.ops.pop(id(op), None)
                if not watchers.ops:
                    del self.watchers_by_key[key]

    def snapshot(self, key: Hashable) -> tuple[Watchers | None, list[DelayedOperation]]:
        with self.lock:
            watchers = self.watchers_by_key.get(key)
            if watchers is None:
                return None, []
            return watchers, list(watchers.ops.values())

    def remove_done(self, watchers: Watchers, done: list[DelayedOperation]) -> None:
        """Drop finished ops from ``watchers``, and the key itself once it watches nothing."""
        with self.lock:
            ops = watchers.ops
            for op in done:
                ops.pop(id(op), None)
            # Another thread may have removed this Watchers and created a fresh one for the key:
            # only remove the mapping if it still points at the object we emptied.
            if not ops and self.watchers_by_key.get(watchers.key) is watchers:
                del self.watchers_by_key[watchers.key]

    def cancel(self, key: Hashable) -> list[DelayedOperation]:
        with self.lock:
            watchers = self.watchers_by_key.pop(key, None)
        if watchers is None:
            return []
        return list(watchers.ops.values())

    def purge_completed(self) -> int:
        purged = 0
        with self.lock:
            for key, watchers in list(self.watchers_by_key.items()):
                ops = watchers.ops
                done = [op_id for op_id, op in ops.items() if op.is_completed()]
                for op_id in done:
                    del ops[op_id]
                purged += len(done)
                if not ops:
                    del self.watchers_by_key[key]
        return purged

    def count_watched(self) -> int:
        with self.lock:
            return sum(len(w.ops) for w in self.watchers_by_key.values())

    def all_ops(self) -> list[DelayedOperation]:
        with self.lock:
            return [op for w in self.watchers_by_key.values() for op in w.ops.values()]
