"""WatcherList iterates snapshots that no Python code can interleave with.

Watchers insert into the live dicts without the shard lock. A GC can start at any allocation and
run Python code (``gc.callbacks``, weakref callbacks, ``__del__``), and running Python code can
hand the GIL to another thread. So a snapshot built with allocations per item
(``list(d.items())``) could see the dict change mid-copy: the reaper's purge failed with
"dictionary changed size during iteration" under ``purgatory bench purgatory``. Here the GC
callback does the mutation itself, on the same thread, so the interleaving is certain.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from purgatory._watchers import WatcherList, Watchers

from .ops import MockDelayedOperation


@contextmanager
def gc_on_every_allocation(callback: Callable[[str, dict[str, int]], None]) -> Iterator[None]:
    """Run ``callback`` from a collection started by (nearly) every container allocation."""
    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


def finished_op() -> MockDelayedOperation:
    op = MockDelayedOperation(1000)
    op.force_complete()
    return op


def test_purge_survives_watchers_inserted_by_code_a_gc_runs() -> None:
    shard = WatcherList()
    watchers = Watchers("key")
    shard.watchers_by_key["key"] = watchers
    # More entries than CPython keeps 2-tuples on its free list (2000): building item tuples for
    # all of them must allocate, so a GC certainly starts inside a ``list(d.items())`` copy.
    finished = [finished_op() for _ in range(5000)]
    for op in finished:
        watchers.ops[id(op)] = op
    inserted: list[MockDelayedOperation] = []

    def watch_during_gc(phase: str, info: dict[str, int]) -> None:
        # What a lock-free watcher on another thread would do: add an op to the key.
        if phase == "start" and len(inserted) < 50:
            op = MockDelayedOperation(1000)
            inserted.append(op)
            watchers.ops[id(op)] = op

    with gc_on_every_allocation(watch_during_gc):
        purged = shard.purge_completed()

    assert inserted, "the GC callback never ran: the test did not interleave anything"
    assert purged == len(finished)
    # Every op inserted during the purge is still watched (none is finished, none was dropped).
    assert set(watchers.ops.values()) == set(inserted)
    assert shard.watchers_by_key["key"] is watchers
