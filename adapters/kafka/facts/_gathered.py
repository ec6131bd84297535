"""GatheredRecords: a process-wide bound on the records fetches hold while they wait for ``min_bytes``.

A :class:`DelayedFetch` with ``min_bytes`` reads what arrives as the high watermark moves and
keeps it until it has enough (each byte is read once). Those records are the record cache's
objects (:class:`SharedReadReader`) while the cache holds them, but once the cache trims or drops
a span the waiting fetches alone keep them alive, and a read that missed the cache made new
objects for offsets other waiters already hold. Unbounded, 1,000 waiters with ``min_bytes``
near 16 MiB grew the service past 3 GB (issue 31, item 1).

The ledger counts what waiting fetches hold, and refuses what would take it past ``max_bytes``;
the fetch refused is answered at once with what it has (Kafka's own behaviour for a fetch that
cannot grow: answer with what is there). What is counted:

* each *batch* (the list one read returned) once, by identity, however many fetches hold it:
  equal waiters get the same list from the reader (``SharedReadReader``'s last answer), so
  1,000 waiters of one range cost one batch. A batch costs its keys' and values' bytes plus
  ``RECORD_OVERHEAD`` per record (the record object, its bytes objects' headers): a batch of
  empty records is not free.
* per fetch, its own list of references once it joined a second batch to its first
  (``PartitionRead.add`` makes one): ``POINTER_BYTES`` per record. Not shared, so charged per
  fetch: 16 MiB of 100-byte records is 1.3 MB of references per waiter.

It is an upper bound of the bytes actually held (two batches of equal records read apart count
twice), never an under-count. A fetch gives back what it took when it finishes, whichever way
(completed, expired, cancelled, moved): ``DelayedFetch.on_complete``.

Concurrency contract: thread-safe (the feed's thread, the fetch-attempt executor, the timer's
executor all take and give back). One lock, held for a few dict operations, never while reading.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..clients._clients import FetchedRecord

__all__ = ["POINTER_BYTES", "RECORD_OVERHEAD", "GatheredRecords", "Holding"]

# A FetchedRecord (slotted dataclass, 5 fields: 80 B) and two bytes objects' headers (33 B
# each), rounded up: what a record costs besides its key and value.
RECORD_OVERHEAD = 160
POINTER_BYTES = 8  # one reference in a fetch's own list


class _Counted:
    """One batch counted: its cost and how many holders took it."""

    __slots__ = ("batch", "cost", "holders")

    def __init__(self, batch: list[FetchedRecord], cost: int) -> None:
        # The batch itself is kept so that its id cannot be reused by another list while it is
        # counted (its holders keep it alive anyway).
        self.batch = batch
        self.cost = cost
        self.holders = 1


class Holding:
    """What one fetch took from a :class:`GatheredRecords`: its batches and its own bytes.

    Made once per fetch, on its first batch kept while waiting, and handed back whole when the
    fetch finishes. ``released`` closes the race of a take on one thread (the feed's) with the
    give-back of a finish on another (the timer's, on expiry, without the fetch's lock): a take
    after the give-back is refused, so nothing is counted for a holder that already let go.
    """

    __slots__ = ("batches", "own_bytes", "released")

    def __init__(self) -> None:
        self.batches: list[list[FetchedRecord]] = []
        self.own_bytes = 0
        self.released = False


class GatheredRecords:
    """Bytes of records held by waiting fetches, each batch counted once (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"GatheredRecords.max_bytes must be an int > 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._batches: dict[int, _Counted] = {}  # by id(batch)
        self._held = 0
        self.peak_bytes = 0  # the most ever held (at most max_bytes)
        self.refusals = 0  # takes refused because they did not fit: fetches answered early

    @property
    def held_bytes(self) -> int:
        """Bytes counted now (never more than ``max_bytes``)."""
        return self._held

    @property
    def batches(self) -> int:
        """Distinct batches counted now."""
        return len(self._batches)

    @staticmethod
    def cost(batch: Sequence[FetchedRecord], size: int) -> int:
        """What ``batch`` (``size`` bytes of keys and values) costs, counted once."""
        return size + RECORD_OVERHEAD * len(batch)

    def take(
        self, holding: Holding, fresh: Sequence[tuple[list[FetchedRecord], int]], own_bytes: int
    ) -> bool:
        """Count ``fresh`` batches (each with its :meth:`cost`) for ``holding``, whose own
        (unshared) bytes are ``own_bytes`` now; True iff counted.

        All or nothing: False, and nothing counted, when the batches not counted yet plus the
        growth of ``own_bytes`` would take the held bytes past ``max_bytes``, or when
        ``holding`` was given back already. A batch another holder took costs nothing more.
        """
        with self._lock:
            if holding.released:
                return False
            table = self._batches
            new = own_bytes - holding.own_bytes
            counting: set[int] = set()
            for batch, cost in fresh:
                ident = id(batch)
                if ident not in table and ident not in counting:
                    counting.add(ident)
                    new += cost
            held = self._held + new
            if new > 0 and held > self.max_bytes:
                self.refusals += 1
                return False
            for batch, cost in fresh:
                entry = table.get(id(batch))
                if entry is None:
                    table[id(batch)] = _Counted(batch, cost)
                else:
                    entry.holders += 1
                holding.batches.append(batch)
            holding.own_bytes = own_bytes
            self._held = held
            if held > self.peak_bytes:
                self.peak_bytes = held
            return True

    def give_back(self, holding: Holding) -> None:
        """Undo every take of ``holding`` (its fetch finished); later takes of it are refused."""
        with self._lock:
            if holding.released:
                return
            holding.released = True
            table = self._batches
            freed = holding.own_bytes
            for batch in holding.batches:
                entry = table[id(batch)]
                entry.holders -= 1
                if not entry.holders:
                    del table[id(batch)]
                    freed += entry.cost
            holding.batches = []
            holding.own_bytes = 0
            self._held -= freed
