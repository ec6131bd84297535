"""Watch entries are recycled once no list holds them (compiled), and recycling never lets a
late release of one operation touch the entry another operation now uses."""

from __future__ import annotations

from purgatory import DelayedOperationPurgatory, _accel
from purgatory._operation_core import Watch
from purgatory._watchers import release_watch
from purgatory.testing import MockTimer

from .ops import MockDelayedOperation

KEYS = ["k1", "k2", "k3"]


def test_release_of_an_op_leaves_an_entry_recycled_for_another_op_alone() -> None:
    old, new = MockDelayedOperation(1000), MockDelayedOperation(1000)
    entry = Watch(new, KEYS)  # as if recycled from old's finish to new's submission
    release_watch(entry, old)  # old's finisher, late
    assert entry.op is new
    release_watch(entry, new)
    assert entry.op is None


def test_pending_ops_complete_on_every_key_while_entries_are_recycled() -> None:
    # Thousands of finishes compact the lists (half dead) and recycle their entries into new
    # submissions; every op still pending must stay watched on all three keys.
    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "recycling", timer=MockTimer(), reaper_enabled=False
    )
    try:
        ring: list[MockDelayedOperation] = []
        finished: list[MockDelayedOperation] = []
        for _ in range(5000):
            op = MockDelayedOperation(10_000)
            assert not purgatory.try_complete_else_watch(op, KEYS)
            ring.append(op)
            if len(ring) > 50:
                done = ring.pop(0)
                assert done.force_complete()
                finished.append(done)
        assert purgatory.watched() <= 3 * 2 * len(ring) + 3 * 50  # compacted as it went
        for key in KEYS:  # each pending op is found on each key: complete them one key at a time
            for op in ring[KEYS.index(key) :: 3]:
                op.completable = True
            assert purgatory.check_and_complete(key) == len(ring[KEYS.index(key) :: 3])
        assert all(op.completions == 1 for op in ring + finished)
        purgatory.purge_completed()
        assert purgatory.watched() == 0
    finally:
        purgatory.shutdown(drain=False)


def test_steady_submit_and_finish_reuses_watch_entries_compiled() -> None:
    if not _accel.compiled():
        return  # recycling is compiled-only (see purgatory/_watchers.py)
    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "recycling-reuse", timer=MockTimer(), reaper_enabled=False
    )
    try:
        ring: list[MockDelayedOperation] = []
        made: dict[int, Watch] = {}  # every entry seen, kept alive so ids stay unique
        reused = 0
        for _ in range(6000):
            op = MockDelayedOperation(10_000)
            purgatory.try_complete_else_watch(op, KEYS)
            entry = op._watch
            assert entry is not None and entry.op is op
            if id(entry) in made:
                reused += 1
            made[id(entry)] = entry
            ring.append(op)
            if len(ring) > 100:
                ring.pop(0).force_complete()
        # Allocated afresh, no entry would come round again (each is kept alive above).
        assert reused > 4000
        assert len(made) < 2000
    finally:
        purgatory.shutdown(drain=False)
