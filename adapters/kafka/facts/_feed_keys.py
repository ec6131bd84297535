"""The change feed's key registry: which Kafka keys are watched, by which purgatory, how often.

The first of the feed's three jobs (the others: the poll thread, ``_feed``; the waker with its
offset index, ``_feed_waker``). The purgatory's listener hooks keep it current: ``on_submitted``
counts an operation's Kafka keys in (and indexes it by the high watermark it needs, when its type
is indexed), ``on_finished`` counts them out — one lock and one count update per key for the
operations one key event finishes (``_release_finished``). The poll asks it which keys to read;
the waker asks it which purgatories to wake.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from purgatory import DelayedOperation

from ._feed_state import Purgatoryish, _Observer
from ._keys import GroupPartitionKey, KafkaKey, TopicKey, TopicPartitionKey
from ._offset_index import Entry, OffsetIndex
from ._tail import PartitionTail

__all__: list[str] = []

# Shared one-key tuples kept (ChangeFeed.on_submitted): one per watched key object, far more
# than the keys one process watches; cleared whole when full.
ONE_KEY_TUPLES = 4096


class _KeyRegistry:
    """Counts watchers per key and purgatory (a base of :class:`ChangeFeed`, which owns the state).

    A base class rather than an object of its own: the feed *is* the purgatories' listener, called
    once per operation submitted and finished (10,000 times in one key event of the service's
    long polls), so the hooks run without a delegation per call; and the registry's counts and
    the waker's reads of them share one lock (``_lock``). ``ChangeFeed.__init__`` sets every
    attribute declared here.
    """

    _lock: threading.Lock
    # key -> {purgatory name -> number of operations watching it there}
    _refs: dict[KafkaKey, dict[str, int]]
    _purgatories: dict[str, Purgatoryish]
    _op_keys: dict[int, _Registration]
    _indexed: dict[tuple[str, TopicPartitionKey], int]
    _finishing: threading.local
    _one_key_tuples: dict[int, tuple[KafkaKey, ...]]
    _log_start_refs: dict[TopicPartitionKey, int]
    _wake: threading.Event
    _observers: list[_Observer]
    index: OffsetIndex
    tail: PartitionTail | None

    def attach(self, purgatory: Purgatoryish) -> None:
        """Follow ``purgatory``'s operations: their Kafka keys are polled while they are pending."""
        with self._lock:
            self._purgatories[purgatory.name] = purgatory
        purgatory.add_listener(self)

    def detach(self, purgatory: Purgatoryish) -> None:
        purgatory.remove_listener(self)
        with self._lock:
            self._purgatories.pop(purgatory.name, None)
            for key in list(self._refs):
                self._refs[key].pop(purgatory.name, None)
                if not self._refs[key]:
                    del self._refs[key]

    def watch(self, purgatory: str, keys: Iterable[Hashable], *, needs_log_start: bool = True) -> None:
        """Count one more watcher of each Kafka key in ``keys`` for ``purgatory`` (others are ignored).

        ``needs_log_start``: the watcher reads log start offsets (ListOffsets earliest is then
        polled for its partitions; keys nobody needs it for skip that request).
        """
        with self._lock:
            added = self._watch_locked(purgatory, keys, needs_log_start)
        if added:
            self._wake.set()  # facts for a new key are wanted now, not at the next interval

    def _watch_locked(self, purgatory: str, keys: Iterable[Hashable], needs_log_start: bool) -> bool:
        added = False
        for key in keys:
            if isinstance(key, TopicPartitionKey | GroupPartitionKey | TopicKey):
                added |= key not in self._refs
                per = self._refs.setdefault(key, {})
                per[purgatory] = per.get(purgatory, 0) + 1
                if needs_log_start and isinstance(key, TopicPartitionKey):
                    self._log_start_refs[key] = self._log_start_refs.get(key, 0) + 1
        if added:
            self._follow_partitions()
        return added

    def release(self, purgatory: str, keys: Iterable[Hashable], *, needs_log_start: bool = True) -> None:
        with self._lock:
            if self._release_locked(purgatory, keys, needs_log_start):
                self._follow_partitions()

    def _release_locked(
        self, purgatory: str, keys: Iterable[Hashable], needs_log_start: bool, times: int = 1
    ) -> bool:
        """Count ``times`` watchers less of each key; True if a key is no longer watched at all."""
        # Runs once per finished operation (10,000 times in one key event of the service's long
        # polls): each key is hashed as few times as the counts allow (a Python-level __hash__).
        dropped = False
        log_start_refs = self._log_start_refs
        refs = self._refs
        for key in keys:
            if needs_log_start:
                starts = log_start_refs.get(key)  # type: ignore[call-overload]
                if starts is not None:
                    if starts > times:
                        log_start_refs[key] = starts - times  # type: ignore[index]
                    else:
                        del log_start_refs[key]  # type: ignore[arg-type]
            per = refs.get(key)  # type: ignore[call-overload]
            if per is None:
                continue
            count = per.get(purgatory)
            if count is None:
                continue
            if count > times:
                per[purgatory] = count - times
                continue
            del per[purgatory]
            if not per:
                del refs[key]  # type: ignore[arg-type]
                dropped = True
        return dropped

    def _follow_partitions(self) -> None:
        # Called with self._lock held, only when a key came or went: O(watched keys) per key
        # change, never per waiter.
        if self.tail is not None:
            self.tail.follow(k for k in self._refs if isinstance(k, TopicPartitionKey))

    def watched_keys(self) -> frozenset[KafkaKey]:
        with self._lock:
            return frozenset(self._refs)

    # PurgatoryListener hooks (the core calls these on submission and on finish).
    def on_submitted(self, purgatory: str, op: DelayedOperation, keys: Sequence[Hashable]) -> None:
        kafka_keys = tuple(k for k in keys if isinstance(k, TopicPartitionKey | GroupPartitionKey | TopicKey))
        if not kafka_keys:
            return
        if len(kafka_keys) == 1:
            # One tuple per key object, shared by its operations (_release_finished groups by
            # it). Identity only: the cached tuple holds its key, so the id is not reused.
            only = kafka_keys[0]
            shared = self._one_key_tuples.get(id(only))
            if shared is not None and shared[0] is only:
                kafka_keys = shared
            else:
                if len(self._one_key_tuples) >= ONE_KEY_TUPLES:
                    self._one_key_tuples.clear()
                self._one_key_tuples[id(only)] = kafka_keys
        # Operation types that never read log start offsets say so (KafkaOperation does);
        # anything else is assumed to need every fact.
        needs = bool(getattr(op, "needs_log_start", True))
        indexed = _indexed_op(op)
        entries: list[tuple[TopicPartitionKey, Entry]] = []
        if indexed is not None:
            # Indexed *before* the submission's first try (this hook runs before it): an event
            # whose pop misses the entry published its facts before, so that try sees them
            # (OffsetIndex's lost-wakeup argument).
            for key in kafka_keys:
                if isinstance(key, TopicPartitionKey):
                    at = indexed.high_watermark_needed(key)
                    if at is not None:
                        entries.append((key, self.index.add(purgatory, key, at, op)))
        with self._lock:
            self._op_keys[id(op)] = _Registration(
                purgatory, kafka_keys, needs, tuple(entries) if entries else (), indexed is not None
            )
            if indexed is not None:
                for key in kafka_keys:
                    if isinstance(key, TopicPartitionKey):
                        self._indexed[purgatory, key] = self._indexed.get((purgatory, key), 0) + 1
            added = self._watch_locked(purgatory, kafka_keys, needs)
        if added:
            self._wake.set()

    def on_finished(self, purgatory: str, op: DelayedOperation) -> None:
        if id(op) not in self._op_keys:
            # Watches no Kafka key (a produce's own request key): nothing to release, and no
            # lock taken per operation for it. A dict lookup is atomic under the GIL, and an op
            # is registered by its own submission, before it can finish.
            return
        finishing = getattr(self._finishing, "ops", None)
        if finishing is not None:  # inside a key event on this thread: released when it ends
            finishing.append(op)
            return
        with self._lock:
            entry = self._op_keys.pop(id(op), None)
            if entry is None:
                return
            if entry.indexed:
                self._unindex_locked(entry)
            if self._release_locked(entry.purgatory, entry.keys, entry.needs_log_start):
                self._follow_partitions()
        for key, indexed in entry.entries:
            self.index.kill(entry.purgatory, key, indexed)

    def _unindex_locked(self, entry: _Registration) -> None:
        """Count ``entry``'s indexed operation out of ``_indexed`` (with ``self._lock`` held)."""
        for key in entry.keys:
            if isinstance(key, TopicPartitionKey):
                left = self._indexed.get((entry.purgatory, key), 0) - 1
                if left > 0:
                    self._indexed[entry.purgatory, key] = left
                else:
                    self._indexed.pop((entry.purgatory, key), None)

    def _release_finished(self, ops: list[DelayedOperation]) -> None:
        """Release what ``ops`` (finished in one key event) held, as ``on_finished`` does for each,
        under one lock: registrations alike (same purgatory, the very same keys tuple, same
        ``needs_log_start``) are counted and released together."""
        killed: list[tuple[str, TopicPartitionKey, Entry]] = []
        follow = False
        with self._lock:
            op_keys = self._op_keys
            # By the keys tuple's identity: on_submitted shares one tuple among the operations
            # of one key (hashing equal tuples would call each key's __hash__ per operation).
            alike: dict[tuple[str, int, bool], list[Any]] = {}
            for op in ops:
                entry = op_keys.pop(id(op), None)
                if entry is None:
                    continue
                if entry.indexed:
                    self._unindex_locked(entry)
                for key, indexed in entry.entries:
                    killed.append((entry.purgatory, key, indexed))
                group = (entry.purgatory, id(entry.keys), entry.needs_log_start)
                counted = alike.get(group)
                if counted is None:
                    alike[group] = [entry.keys, 1]
                else:
                    counted[1] += 1
            for (purgatory, _, needs_log_start), (keys, times) in alike.items():
                if self._release_locked(purgatory, keys, needs_log_start, times):
                    follow = True
            if follow:
                self._follow_partitions()
        for purgatory, key, indexed in killed:
            self.index.kill(purgatory, key, indexed)

    def on_released(self, purgatory: str, op: DelayedOperation) -> None:
        """The purgatory let go of ``op`` unfinished (refused, or handed back by cancel_for_key)."""
        self.on_finished(purgatory, op)

    def add_observer(self, observer: _Observer) -> None:
        """Called after each successful poll with the keys that changed (benchmarks use it)."""
        self._observers = [*self._observers, observer]


def _indexed_op(op: object) -> _IndexedOp | None:
    """``op`` when its type is indexed by the high watermark it needs (OffsetIndex), else None."""
    if getattr(op, "indexed_by_high_watermark", False):
        return cast(_IndexedOp, op)
    return None


class _IndexedOp(Protocol):
    """An operation indexed by high watermark (``KafkaOperation.indexed_by_high_watermark``)."""

    def safe_try_complete(self) -> bool: ...

    def is_completed(self) -> bool: ...

    def high_watermark_needed(self, key: TopicPartitionKey) -> int | None: ...


@dataclass(frozen=True, slots=True)
class _Registration:
    """What the feed must undo when an operation finishes or is released (one per waiter: slotted,
    and ``entries`` the shared empty tuple for unindexed operations — the service's long polls)."""

    purgatory: str
    keys: tuple[KafkaKey, ...]
    needs_log_start: bool
    entries: tuple[tuple[TopicPartitionKey, Entry], ...]
    indexed: bool
