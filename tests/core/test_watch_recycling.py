"""Watch entries are recycled once no list holds them (compiled), and recycling never lets a
late release of one operation touch the entry another operation now uses."""

from __future__ import annotations

import collections
import gc
import itertools
import random
import sys
import threading
import time
from collections.abc import Hashable

from purgatory import DelayedOperation, DelayedOperationPurgatory, _accel
from purgatory._operation_core import Watch
from purgatory._watchers import WatcherList, Watchers, release_watch
from purgatory.testing import MockTimer

from .ops import MockDelayedOperation
from .stress import Handoff

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


# -- the recycling race -------------------------------------------------------------------------
#
# A watch entry is recycled (compiled) once every list that held it has dropped it. Whoever still
# holds a reference to it after that — a lock-free reader that copied a list, a submitter about
# to append it — would see *another* operation through it: a key event would try an op not
# watched on that key (maybe another purgatory's), cancel_for_key would hand back and un-time a
# stranger, a late append would leave a stranger on a list. The stress below opens those windows
# as wide as CPython allows and checks that no operation is ever reached through a key it was not
# watched on, and that every operation finishes exactly once.


class _Context(threading.local):
    """The key event this thread is in (purgatory name, key), or None."""

    current: tuple[str, Hashable] | None = None


_HASHES = itertools.count()


class _SwitchingKey:
    """A watch key whose hash runs Python code: with a 1 µs switch interval the GIL may change
    hands inside every dict lookup of the core, between its checks and its stores."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        if next(_HASHES) % 32 == 0:
            time.sleep(0.0001)  # now and then a long pause: other threads get well ahead
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SwitchingKey) and other.name == self.name

    def __repr__(self) -> str:
        return f"key {self.name}"


class _StrictOp(DelayedOperation):
    """Records every finish, and every try from a key event it was not watched on."""

    __slots__ = ("_context", "completable", "finishes", "keys", "purgatory", "strangers")

    def __init__(self, purgatory: str, keys: list[_SwitchingKey], context: _Context) -> None:
        super().__init__(600_000)
        self.purgatory = purgatory
        self.keys = keys
        self.completable = False
        self.finishes = 0
        self.strangers: list[tuple[str, Hashable]] = []
        self._context = context

    def try_complete(self) -> bool:
        event = self._context.current
        if event is not None and (event[0] != self.purgatory or event[1] not in self.keys):
            self.strangers.append(event)
        return self.completable and self.force_complete()

    def on_complete(self) -> None:
        self.finishes += 1


def test_recycled_entries_never_reach_an_op_through_a_key_it_was_not_watched_on() -> None:
    per_purgatory = 30_000  # 60k operations over two purgatories sharing one entry pool
    keys = [_SwitchingKey(f"k{i}") for i in range(12)]
    context = _Context()
    rng = random.Random(15)
    names = ("recycle-a", "recycle-b")
    purgatories = {name: DelayedOperationPurgatory[_StrictOp](name) for name in names}
    ops = {
        name: [_StrictOp(name, rng.sample(keys, 3), context) for _ in range(per_purgatory)] for name in names
    }
    handoff: Handoff[_StrictOp] = Handoff()
    errors: list[BaseException] = []
    cancelled_strangers: list[tuple[str, Hashable, _StrictOp]] = []

    def submitter(name: str) -> None:
        try:
            for i, op in enumerate(ops[name]):
                while len(handoff) > 4:  # keep the finisher close behind: it finishes ops
                    time.sleep(0)  # before, while and just after they are submitted
                handoff.put(op)
                purgatories[name].try_complete_else_watch(op, op.keys)
                if i % 97 == 0:  # Kafka's tool: now and then a key event, or a cancelled key
                    key = keys[i % len(keys)]
                    context.current = (name, key)
                    try:
                        purgatories[name].check_and_complete(key)
                        if i % 5 == 0:
                            for lost in purgatories[name].cancel_for_key(key):
                                if lost.purgatory != name or key not in lost.keys:
                                    cancelled_strangers.append((name, key, lost))
                                lost.force_complete()  # the caller's now
                    finally:
                        context.current = None
        except BaseException as exc:
            errors.append(exc)

    def finisher() -> None:
        # Finish ops half by force, half through a key event: their entries are released,
        # their lists compacted, their entries recycled into the submitters' next ops.
        turns = itertools.count(1)

        def finish(op: _StrictOp) -> None:
            turn = next(turns)
            if turn % 2:
                op.force_complete()
                return
            op.completable = True
            key = op.keys[turn % 3]
            context.current = (op.purgatory, key)
            try:
                purgatories[op.purgatory].check_and_complete(key)
            except BaseException as exc:
                errors.append(exc)
            finally:
                context.current = None

        handoff.drain(finish)

    def yield_on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            time.sleep(0.0001)  # a collection inside the core hands the GIL over, as a __del__ may

    old_interval = sys.getswitchinterval()
    old_threshold = gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(200)
    gc.callbacks.append(yield_on_collection)
    threads = [threading.Thread(target=submitter, args=(name,), name=f"submit-{name}") for name in names]
    threads.append(threading.Thread(target=finisher, name="finisher"))
    try:
        for thread in threads:
            thread.start()
        for thread in threads[:2]:
            thread.join(120)
        handoff.close()
        threads[2].join(120)
    finally:
        handoff.close()
        gc.callbacks.remove(yield_on_collection)
        gc.set_threshold(*old_threshold)
        sys.setswitchinterval(old_interval)
    try:
        assert not any(thread.is_alive() for thread in threads), "a stress thread is still running"
        assert not errors, f"{len(errors)} calls raised, first: {errors[0]!r}"
        assert not cancelled_strangers, f"cancel_for_key handed back strangers: {cancelled_strangers[:3]}"
        everyone = ops[names[0]] + ops[names[1]]
        strangers = [(op.purgatory, op.keys, op.strangers) for op in everyone if op.strangers]
        assert not strangers, f"{len(strangers)} ops tried by a key event not theirs: {strangers[:3]}"
        finishes = collections.Counter(op.finishes for op in everyone)
        assert finishes == {1: len(everyone)}, f"finishes per op: {dict(finishes)}"
        for purgatory in purgatories.values():
            purgatory.purge_completed()
            assert purgatory.watched() == 0, "no finished op left in a watch list"
            assert purgatory.num_delayed() == 0, "no finished op left in the timer"
    finally:
        for purgatory in purgatories.values():
            purgatory.shutdown(drain=False)


def test_the_entries_kept_for_reuse_are_counted_where_a_leak_check_can_read_them_and_are_bounded() -> None:
    """The pool is memory kept by design: ``purgatory.testing.pooled_watch_entries`` lets a leak
    check (the soak) discount it without reaching into a private module; it never passes POOL_MAX."""
    from purgatory._watchers import POOL_MAX
    from purgatory.testing import pooled_watch_entries

    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "recycling-count", timer=MockTimer(), reaper_enabled=False
    )
    try:
        ops = [MockDelayedOperation(10_000) for _ in range(POOL_MAX)]  # 3 entries each: past the cap
        for op in ops:
            assert not purgatory.try_complete_else_watch(op, ["a", "b", "c"])
        for key in ("a", "b", "c"):
            for op in ops:
                op.completable = True
            purgatory.check_and_complete(key)
        assert all(op.completions == 1 for op in ops)
        pooled = pooled_watch_entries()
        if _accel.compiled():
            assert 0 < pooled <= POOL_MAX, pooled
        else:
            assert pooled == 0, "the interpreted build recycles nothing"
    finally:
        purgatory.shutdown(drain=False)


def test_a_finish_compaction_keeps_entries_still_holding_their_op_which_the_purge_drops() -> None:
    """The compaction a finish starts drops released entries only; it reads no operation, so an
    entry whose op finished but is not released yet (its finisher between the claim and
    ``operation_finished``) stays until the reaper's purge, which checks each op and counts it."""
    shard = WatcherList()
    watchers = Watchers("key")
    shard.watchers_by_key["key"] = watchers
    released, held, live = (MockDelayedOperation(1000) for _ in range(3))
    entries = [Watch(op, ["key"]) for op in (released, held, live)]
    for entry in entries:
        entry.slots += 1
        watchers.ops.append(entry)
    released.force_complete()  # no owner: nothing released the entries; do it by hand for one
    entries[0].op = None
    held.force_complete()  # finished, entry still holding it

    shard.compact_released(watchers)
    assert watchers.ops == entries[1:]

    assert shard.purge_completed() == 1  # the held entry of a finished op, now dropped
    assert watchers.ops == [entries[2]]
