"""Exactly-once under contention: 8 threads on shared keys, racing key events, force and expiry."""

from __future__ import annotations

import random
import sys
import threading
import time

from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome

from .stress import Handoff


class _Counted(DelayedOperation):
    """Completes once ``state[key] >= target``; counts every callback in a shared ledger."""

    def __init__(self, delay_ms: int, key: str, target: int, state: dict[str, int], ledger: _Ledger) -> None:
        super().__init__(delay_ms)
        self.key, self.target, self.state, self.ledger = key, target, state, ledger

    def try_complete(self) -> bool:
        if self.state.get(self.key, 0) >= self.target:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.ledger.record(self, "complete")

    def on_expiration(self) -> None:
        self.ledger.record(self, "expire")


class _Ledger:
    def __init__(self, expected: int) -> None:
        self.lock = threading.Lock()
        self.completes: dict[int, int] = {}
        self.expires: dict[int, int] = {}
        self.expected = expected
        self.all_done = threading.Event()

    def record(self, op: DelayedOperation, what: str) -> None:
        with self.lock:
            book = self.completes if what == "complete" else self.expires
            book[id(op)] = book.get(id(op), 0) + 1
            if len(self.completes) == self.expected:
                self.all_done.set()


def test_exactly_once_with_eight_threads_on_shared_keys() -> None:
    """Attacks the window between a key event and the watch: submitters, key-event threads and the
    expiry thread all race on five shared keys; ~a third of the ops can only expire."""
    threads_n, per_thread = 8, 1500
    keys = [f"key{i}" for i in range(5)]
    state: dict[str, int] = {}
    ledger = _Ledger(threads_n * per_thread)
    purgatory: DelayedOperationPurgatory[_Counted] = DelayedOperationPurgatory(
        "contention", purge_interval=100
    )
    ops: list[_Counted] = []
    ops_lock = threading.Lock()
    start = threading.Barrier(threads_n)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        mine = []
        for i in range(per_thread):
            key = rng.choice(keys)
            # A target no key event reaches makes the op expire (timeouts 1-60 ms).
            target = rng.randint(1, 300) if rng.random() < 0.66 else 10**9
            op = _Counted(rng.randint(1, 60), key, target, state, ledger)
            mine.append(op)
            purgatory.try_complete_else_watch(op, [key, rng.choice(keys)])
            if i % 3 == 0:
                event_key = rng.choice(keys)
                state[event_key] = state.get(event_key, 0) + 1  # racy by design: only grows
                purgatory.check_and_complete(event_key)
            if i % 97 == 0:
                rng.choice(mine).force_complete()
        with ops_lock:
            ops.extend(mine)

    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads_n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert ledger.all_done.wait(30), f"only {len(ledger.completes)} of {len(ops)} operations finished"
    purgatory.shutdown()

    assert len(ops) == threads_n * per_thread
    assert all(count == 1 for count in ledger.completes.values()), "on_complete ran more than once"
    expired = [op for op in ops if op.outcome is Outcome.EXPIRED]
    assert set(ledger.expires) == {id(op) for op in expired}, "on_expiration runs exactly for expired ops"
    assert all(count == 1 for count in ledger.expires.values())
    assert expired, "the workload must exercise expiry"
    assert len(expired) < len(ops), "the workload must exercise key-event completion"
    stats = purgatory.stats.as_dict()
    assert stats["completed"] + stats["expired"] == len(ops)
    assert stats["expired"] == len(expired)


def test_watched_returns_to_zero_after_an_explicit_purge() -> None:
    purgatory: DelayedOperationPurgatory[_Counted] = DelayedOperationPurgatory("purge-all", purge_interval=10)
    state: dict[str, int] = {"a": 0}
    ledger = _Ledger(500)
    ops = [_Counted(5, "a", 1, state, ledger) for _ in range(500)]
    try:
        for op in ops:
            purgatory.try_complete_else_watch(op, ["a", "b"])
        assert ledger.all_done.wait(10), "every op expires"
        # Expired ops linger in watch lists until a key event or a purge (the reaper purges only
        # once its estimate passes purge_interval, so some may remain): purge now.
        purgatory.purge_completed()
        assert purgatory.watched() == 0, "no finished op is left in any watch list"
    finally:
        purgatory.shutdown()


class _RacedOp(DelayedOperation):
    """Never completes by itself; ``try_complete`` hands the GIL over now and then, so the racing
    ``force_complete`` lands inside every window of a submission. Counts its finishes."""

    __slots__ = ("finishes", "yields")

    def __init__(self, yields: bool) -> None:
        super().__init__(60_000)
        self.finishes = 0
        self.yields = yields

    def try_complete(self) -> bool:
        if self.yields:
            time.sleep(0)  # releases the GIL: the finisher may run between our two tries
        return False

    def on_complete(self) -> None:
        self.finishes += 1


def test_submissions_racing_force_complete_finish_each_once() -> None:
    """Attacks a submission racing ``force_complete`` on another thread (Kafka's performance tool:
    its completion thread may complete a request before, during or after its submission).

    The submitter queues each op for the finisher *before* submitting it (as Kafka's tool does),
    so the finisher completes ops before their submission (they must be kept nowhere, no error),
    between the two tries, mid-watch and after the timer add. Used to raise
    ``InvalidOperationError`` (finished before submission) and, compiled, ``TypeError: None
    object expected; got Outcome`` (a narrowed field re-read after the finish)."""
    total = 60_000
    rng = random.Random(15)
    ops = [_RacedOp(rng.random() < 0.2) for _ in range(total)]
    purgatory: DelayedOperationPurgatory[_RacedOp] = DelayedOperationPurgatory("race-force")
    handoff: Handoff[_RacedOp] = Handoff()
    errors: list[BaseException] = []

    def finisher() -> None:
        handoff.drain(lambda op: op.force_complete())

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows: more interleavings
    thread = threading.Thread(target=finisher, name="finisher")
    thread.start()
    try:
        for op in ops:
            handoff.put(op)
            try:
                purgatory.try_complete_else_watch(op, ["a", "b", "c"])
            except Exception as exc:
                errors.append(exc)
    finally:
        handoff.close()
        thread.join(60)
        sys.setswitchinterval(old_interval)
        purgatory.shutdown()
    assert not thread.is_alive(), "the finisher thread ended"
    assert not errors, f"{len(errors)} submissions raised, first: {errors[0]!r}"
    assert [op.finishes for op in ops].count(1) == total, "every op finished exactly once"
    assert all(op.outcome is Outcome.COMPLETED for op in ops), "each by the racing force_complete"
    assert purgatory.watched() == 0, "no finished op left in a watch list"
    assert purgatory.num_delayed() == 0, "no finished op left in the timer"
