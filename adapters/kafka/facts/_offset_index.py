"""OffsetIndex: waiting operations per partition, ordered by the high watermark they need.

Why it lives in the change feed: a key event must cost what it completes (issue 12), and for
the commonest event — a partition's high watermark moved, nothing else about it changed — the
feed knows exactly which operations that can finish: the ones whose offset it passed.
``check_and_complete(key)`` tries every operation on the key (Kafka's ``Watchers``): with 10,000
``DelayedReplication`` on 100 partitions, ~100 tries per push to complete the one or two whose
records were just replicated (docs/performance.md, "Change-feed completion lag").

Algorithm: per (purgatory, partition) a binary heap (``heapq``) of entries
``[at, seq, op]``: ``op`` may progress once the high watermark reaches ``at`` (for a
``DelayedReplication``: its offset + 1). A high-watermark advance to ``hw`` pops the entries with
``at <= hw`` — O(k log n) for k due — and the feed tries each (``safe_try_complete``). An
operation still waiting after its try tells again what it needs (``high_watermark_needed``) and
is pushed back (a read-back that brought nothing: it is then tried on every later advance, as
``check_and_complete`` would). Worked example: produces waiting at offsets 7, 9 and 12 of
``orders-3``; the tail pushes high watermark 10 → entries 8 and 10 are popped and tried, the
one at 13 is not looked at.

Finished or released operations are not searched for: their entries are marked dead
(``entry[OP] = None``, the op's registration keeps them) and skipped when popped; a heap is
compacted once at least half of it is dead (O(1) per death amortised, as the watcher lists),
and dropped once all of it is, so an operation that expires before its offset is ever reached
does not stay in memory, nor does the heap of a partition no longer watched.

Only *high-watermark-only* changes go through the index; every other change of a partition's
facts (leader, epoch, ISR, error, first facts) still calls ``check_and_complete`` — those may
finish every operation on the key (NOT_LEADER_OR_FOLLOWER), which is then what it completes.

Concurrency contract: every method may be called from any thread; one lock guards the heaps,
held for heap operations only, never while user code runs. The lost-wakeup argument (the
feed's): an operation is pushed *before* its submission's first try, and an event publishes its
facts *before* it pops; so a pop that misses an entry ran before the push, and the try after
the push sees the published facts. An entry popped by one event is out of the heap while it is
tried; an event meanwhile cannot see it, so :meth:`ChangeFeed._wake_indexed` pops again when
the published high watermark moved past the one it handled.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Hashable
from typing import Any, Final

__all__ = ["COMPACT_MIN", "OffsetIndex"]

AT: Final = 0  # entry field: the high watermark the op needs
OP: Final = 2  # entry field: the op; None once it finished or was released (dead)
# Heaps shorter than this are never compacted: their dead entries cost a few bytes each, and a
# rebuild per death of a tiny heap would be churn for nothing.
COMPACT_MIN: Final = 64

Entry = list[Any]  # [at: int, seq: int, op | None]: a list, so heapq compares (at, seq) in C


class _Heap:
    __slots__ = ("dead", "entries")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.dead = 0  # heuristic (when to compact), never read as exact


class OffsetIndex:
    """Heaps of waiting operations per (purgatory, partition) by needed high watermark (module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heaps: dict[tuple[str, Hashable], _Heap] = {}
        self._seq = itertools.count()  # ties broken by arrival: heapq never compares two ops

    def add(self, purgatory: str, key: Hashable, at: int, op: object) -> Entry:
        """Index ``op`` on ``key`` until the high watermark reaches ``at``; the entry, to kill later."""
        entry: Entry = [at, next(self._seq), op]
        with self._lock:
            self._push_locked(purgatory, key, entry)
        return entry

    def due(self, purgatory: str, key: Hashable, high_watermark: int) -> list[Entry]:
        """Pop the live entries of ``key`` needing at most ``high_watermark``, in offset order."""
        out: list[Entry] = []
        with self._lock:
            heap = self._heaps.get((purgatory, key))
            if heap is None:
                return out
            entries = heap.entries
            while entries and entries[0][AT] <= high_watermark:
                entry = heapq.heappop(entries)
                if entry[OP] is None:
                    heap.dead = max(heap.dead - 1, 0)
                else:
                    out.append(entry)
            if not entries:
                del self._heaps[purgatory, key]
        return out

    def again(self, purgatory: str, key: Hashable, entry: Entry, at: int) -> None:
        """Put a popped ``entry`` back, now needing ``at`` — unless it died since it was popped."""
        with self._lock:
            if entry[OP] is None:
                return
            entry[AT] = at
            self._push_locked(purgatory, key, entry)

    def _push_locked(self, purgatory: str, key: Hashable, entry: Entry) -> None:
        heap = self._heaps.get((purgatory, key))
        if heap is None:
            heap = self._heaps[purgatory, key] = _Heap()
        heapq.heappush(heap.entries, entry)

    def kill(self, purgatory: str, key: Hashable, entry: Entry) -> None:
        """``entry``'s op finished or was released: skip it from now on, compact if half dead."""
        with self._lock:
            if entry[OP] is None:
                return
            entry[OP] = None
            heap = self._heaps.get((purgatory, key))
            if heap is None:
                return  # popped and not put back: in no heap
            heap.dead += 1
            entries = heap.entries
            # A small heap is compacted only once it may be all dead (its key no longer
            # watched, say): filtered, not dropped on the count alone — ``dead`` may run high.
            if heap.dead * 2 >= len(entries) and (len(entries) >= COMPACT_MIN or heap.dead >= len(entries)):
                live = [e for e in entries if e[OP] is not None]
                heapq.heapify(live)
                heap.entries = live
                heap.dead = 0
                if not live:
                    del self._heaps[purgatory, key]

    def size(self, purgatory: str, key: Hashable) -> int:
        """Entries held for ``key`` (dead ones not yet compacted included): tests and benchmarks."""
        with self._lock:
            heap = self._heaps.get((purgatory, key))
            return 0 if heap is None else len(heap.entries)

    def keys(self) -> int:
        """How many (purgatory, partition) heaps exist (an empty one is dropped)."""
        with self._lock:
            return len(self._heaps)
