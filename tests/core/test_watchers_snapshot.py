"""WatcherList iterates snapshots that no Python code can interleave with.

Watchers append to the live lists without the shard lock. A GC can start at any allocation and
run Python code (``gc.callbacks``, weakref callbacks, ``__del__``), and running Python code can
hand the GIL to another thread. So a snapshot built with allocations per item
(``list(d.items())``) could see the dict change mid-copy: the reaper's purge failed with
"dictionary changed size during iteration" under ``purgatory bench purgatory``. Here the GC
callback does the mutation itself, on the same thread, so the interleaving is certain.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from purgatory import _accel
from purgatory._operation_core import Watch
from purgatory._watchers import SHARDS, WatcherList, Watchers, keys_not_holding

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


def test_purge_keeps_entries_appended_by_code_a_gc_runs() -> None:
    shard = WatcherList()
    watchers = Watchers("key")
    shard.watchers_by_key["key"] = watchers
    # Many finished entries: the purge's filtering allocates as it goes (pure Python), so GCs
    # start inside it while it rewrites the list.
    finished = [finished_op() for _ in range(5000)]
    for op in finished:
        watchers.ops.append(Watch(op, ["key"]))
    inserted: list[MockDelayedOperation] = []
    armed = False

    def watch_during_gc(phase: str, info: dict[str, int]) -> None:
        # What a lock-free watcher on another thread does (try_complete_else_watch): append, then
        # re-read the mapping and append again if the purge removed the key meanwhile.
        if armed and phase == "start" and len(inserted) < 50:
            op = MockDelayedOperation(1000)
            inserted.append(op)
            entry = Watch(op, ["key"])
            by_key = shard.watchers_by_key
            while True:
                current = by_key.get("key")
                if current is None:
                    current = by_key.setdefault("key", Watchers("key"))
                current.ops.append(entry)
                if by_key.get("key") is current:
                    break

    with gc_on_every_allocation(watch_during_gc):
        armed = True
        purged = shard.purge_completed()
        armed = False

    if not inserted and _accel.compiled():
        # Compiled, the copy and the loop allocate little: no GC, so no Python code, may start
        # inside the purge. The pure-Python run of this suite checks the interleaving.
        pytest.skip("no GC started inside the compiled purge: nothing could interleave")
    assert inserted, "the GC callback never ran inside the purge: the test interleaved nothing"
    assert purged == len(finished)
    # Every op appended during the purge is still watched under the key (none was dropped).
    assert set(shard.snapshot("key")) == set(inserted)


# The copy races with a compaction: long enough that the shrink reallocates the list's array.
FINISHED_ENTRIES = 20_000
LIVE_ENTRIES = 10


def copy_while_a_gc_compacts() -> None:
    """Take each lock-free copy of a watch list (a snapshot; ``keys_not_holding``'s scan) while a
    GC that the copy's own allocation starts compacts that list — what a compaction on another
    thread does when the GC's Python code hands it the GIL. Run in a child process (a crash must
    fail the test, not end the run); see _watchers._copy."""
    _copy_while_a_gc_compacts(scan=False)
    _copy_while_a_gc_compacts(scan=True)


def _copy_while_a_gc_compacts(scan: bool) -> None:
    shard = WatcherList()
    watchers = Watchers("key")
    shard.watchers_by_key["key"] = watchers
    finished = [finished_op() for _ in range(FINISHED_ENTRIES)]
    live = [MockDelayedOperation(1000) for _ in range(LIVE_ENTRIES)]
    for op in [*finished, *live]:
        entry = Watch(op, ["key"])
        entry.slots += 1
        watchers.ops.append(entry)  # the list's only reference: a compaction frees what it drops
    first = watchers.ops[0]
    shards, keys = [shard] * SHARDS, ["key"]
    compacted = False

    def compact_during_gc(phase: str, info: dict[str, int]) -> None:
        nonlocal compacted
        if phase == "start" and not compacted:
            compacted = True
            shard.compact(watchers)  # drops the finished: the list shrinks to LIVE_ENTRIES

    with first_list_allocation_collects(compact_during_gc):
        # The function's first list comes from the free list; its second, the copy, collects.
        if scan:
            missing = keys_not_holding(shards, keys, first)  # compares with every copied entry
        else:
            seen = shard.snapshot("key")
    if not scan and _accel.compiled():
        # Compiled, a snapshot copies nothing (one native sweep, see _live_ops): no GC inside.
        assert not compacted and seen == [*finished, *live]
        return
    assert compacted, "no GC started inside the copy: the test interleaved nothing"
    if scan:
        assert missing == ["key"], "compacted before the copy read the list: the entry is gone"
    else:
        assert seen == live, "compacted before the copy read the list: the live ops, in order"


@contextmanager
def first_list_allocation_collects(callback: Callable[[str, dict[str, int]], None]) -> Iterator[None]:
    """Within: one list from the lists' free list, then the next list allocated starts a GC that
    runs ``callback``; no GC before that."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.disable()  # setting up: counted, not collected (a collection would refill the free list)
    try:
        spare = [[] for _ in range(100)]  # the free list (80 at most) emptied; gen0's count past 1
        del spare[0]  # ... and one list back on it
        gc.set_threshold(1)
        gc.callbacks.append(callback)
        gc.enable()
        yield
    finally:
        gc.disable()
        gc.callbacks.remove(callback)
        gc.set_threshold(*threshold)
        if enabled:
            gc.enable()


@pytest.mark.parametrize("pure", [True, False], ids=["pure", "as-built"])
def test_a_copy_survives_a_compaction_a_gc_runs_inside_it(pure: bool) -> None:
    """A regression: ``ops[:]`` read the list's length before allocating the copy, so a GC started
    by that allocation could shrink the list first; the copy then read freed memory (a segfault
    in the pure-Python run of tests/core/test_concurrency.py). With the debug allocator filling
    freed memory, the pure snapshot on the old slice crashed every time."""
    env = {**os.environ, "PYTHONMALLOC": "debug", "PYTHONFAULTHANDLER": "1"}
    if pure:
        env[_accel.PURE_ENV] = "1"
    else:
        env.pop(_accel.PURE_ENV, None)
    code = "from tests.core.test_watchers_snapshot import copy_while_a_gc_compacts as f; f()"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"a copy crashed or failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
