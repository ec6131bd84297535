"""Regression tests for the Apache Kafka purgatory bugs this design must never reintroduce.

Each test is named after the Kafka issue and says, in its docstring, what went wrong there and
which window the test attacks. Every multi-thread test is bounded: threads are joined with a
timeout, so a deadlock or a lost completion fails the test instead of hanging it.
"""

from __future__ import annotations

import gc
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Hashable

import pytest

from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome
from purgatory._operation import LockLike
from purgatory._watchers import SHARDS
from purgatory.testing import MockTimer

JOIN_TIMEOUT_S = 30.0  # far beyond the work's length on 2 cores: reaching it means a hang
PROGRESS_CHECK_S = 0.5  # how often a bounded join looks whether the work still advances
OPS_PER_THREAD_3994 = 100  # lock hand-offs between 8 threads on 2 cores cost GIL switches: keep it short
LONG_DELAY_MS = 120_000  # an op that must complete by key event: its expiry would be a miss


class Op(DelayedOperation):
    """Completes once ``ready``; counts its callbacks; ``hook`` runs inside ``try_complete``."""

    def __init__(self, delay_ms: int, lock: LockLike | None = None) -> None:
        super().__init__(delay_ms, lock)
        self.ready = False
        self.completions = 0
        self.expirations = 0
        self.hook: Callable[[Op], None] | None = None
        self.after_complete: Callable[[Op], None] | None = None
        self.done = threading.Event()

    def try_complete(self) -> bool:
        if self.hook is not None:
            self.hook(self)
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions += 1
        if self.after_complete is not None:
            self.after_complete(self)
        self.done.set()

    def on_expiration(self) -> None:
        self.expirations += 1


def _run_threads(
    targets: list[Callable[[], None]], what: str, progress: Callable[[], int] | None = None
) -> None:
    """Start one thread per target; fail (not hang) if any is still running after the bound.

    With ``progress`` (a count that grows while the work advances) the bound is on a *stall*:
    the threads fail only after ``JOIN_TIMEOUT_S`` without the count moving. A deadlock stops
    the count; a machine shared with other test runs only slows it (KAFKA-3994's eight threads
    took 7-16 s at load 12-17 on 2 cores, pure mode, so a bound on the whole run was a flake).
    """
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported below: a dead worker must fail the test
                errors.append(exc)

        return run

    threads = [
        threading.Thread(target=guarded(t), name=f"regression-{i}", daemon=True)
        for i, t in enumerate(targets)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S  # one bound for all, not one per thread
    seen = progress() if progress is not None else 0
    for t in threads:
        while True:
            t.join(max(0.0, min(deadline, time.monotonic() + PROGRESS_CHECK_S) - time.monotonic()))
            if not t.is_alive() or time.monotonic() >= deadline:
                break
            if progress is not None and (now := progress()) != seen:
                seen, deadline = now, time.monotonic() + JOIN_TIMEOUT_S  # advancing: not a hang
    stuck = [t.name for t in threads if t.is_alive()]
    bound = "without progress" if progress is not None else "in all"
    assert not stuck, f"{what}: threads still running after {JOIN_TIMEOUT_S} s {bound} (deadlock?): {stuck}"
    assert not errors, f"{what}: a worker failed: {errors[0]!r}"


def _shutdown_bounded(purgatory: DelayedOperationPurgatory[Op]) -> None:
    """Shut down on a helper thread: after a deadlock the shard locks may be held for ever."""
    stopper = threading.Thread(target=purgatory.shutdown, name="regression-shutdown", daemon=True)
    stopper.start()
    stopper.join(JOIN_TIMEOUT_S)
    # Called from `finally`: when the test already failed (a deadlock), keep that failure.
    if sys.exc_info()[0] is None:
        assert not stopper.is_alive(), "shutdown() hung: a purgatory lock is held for ever"


# -- KAFKA-664 ----------------------------------------------------------------------------------


def test_kafka_664_completed_operations_do_not_leak_in_watcher_lists() -> None:
    """KAFKA-664: a satisfied request stayed in the watcher lists of its other keys, and with
    many keys the lists grew without bound (an out-of-memory in production). Here ops on three
    keys each finish every way there is — key event, force_complete, expiry — and none may remain
    in any watch list, or stay reachable at all, even without a purge."""
    timer = MockTimer()
    purgatory: DelayedOperationPurgatory[Op] = DelayedOperationPurgatory(
        "kafka-664", timer=timer, reaper_enabled=False, purge_interval=10**9
    )
    rng = random.Random(664)
    keys = [f"topic-{i}" for i in range(100)]
    refs: list[weakref.ref[Op]] = []
    for round_no in range(20):
        batch: list[tuple[Op, list[str]]] = []
        for _ in range(500):
            op_keys = rng.sample(keys, 3)
            op = Op(rng.randint(1, 100) if rng.random() < 0.33 else LONG_DELAY_MS)
            purgatory.try_complete_else_watch(op, op_keys)
            batch.append((op, op_keys))
            refs.append(weakref.ref(op))
        assert purgatory.watched() == 3 * 500, f"round {round_no}: every pending op on its 3 keys"
        for op, op_keys in batch:
            if op.delay_ms == LONG_DELAY_MS:
                if rng.random() < 0.5:
                    op.ready = True
                    purgatory.check_and_complete(rng.choice(op_keys))
                else:
                    op.force_complete()
        timer.advance_clock(100)
        assert purgatory.watched() == 0, f"round {round_no}: finished ops left in watch lists"
        assert purgatory.num_delayed() == 0
        assert all(op.completions == 1 for op, _ in batch)
        del batch, op
    gc.collect()
    alive = sum(1 for ref in refs if ref() is not None)
    assert alive == 0, f"{alive} finished operations are still reachable"
    assert purgatory.purge_completed() == 0, "nothing was left for a purge to find"
    purgatory.shutdown()


# -- KAFKA-8334 ---------------------------------------------------------------------------------


class _CheckThenPause(Op):
    """Reads the condition first, then runs the hook: the hook stands for the time between a
    check and the watch, in which the world may change."""

    def try_complete(self) -> bool:
        ready = self.ready
        if self.hook is not None:
            self.hook(self)
        return self.force_complete() if ready else False


def test_kafka_8334_condition_true_between_first_try_and_watch_still_completes() -> None:
    """KAFKA-8334: a completion attempt could be skipped under contention (``tryLock`` failed, no
    retry), leaving the op to wait for its timeout. The sharpest window: the condition turns true,
    and its key event fires, after the op's first try but before it is watched — the event finds
    nothing to complete. The second try after watching must see it."""
    purgatory: DelayedOperationPurgatory[Op] = DelayedOperationPurgatory("kafka-8334")
    in_first_try, event_fired = threading.Event(), threading.Event()
    op = _CheckThenPause(LONG_DELAY_MS)
    tries: list[bool] = []

    def first_try_waits_for_the_event(o: Op) -> None:
        tries.append(o.ready)
        if len(tries) == 1:  # the condition was read (False) ... now the world changes
            in_first_try.set()
            assert event_fired.wait(JOIN_TIMEOUT_S), "the key event never fired"

    op.hook = first_try_waits_for_the_event
    completed_by_event: list[int] = []

    def key_event() -> None:
        assert in_first_try.wait(JOIN_TIMEOUT_S)
        op.ready = True
        completed_by_event.append(purgatory.check_and_complete("partition-0"))
        event_fired.set()

    results: list[bool] = []
    try:
        _run_threads(
            [lambda: results.append(purgatory.try_complete_else_watch(op, ["partition-0"])), key_event],
            "KAFKA-8334 window",
        )
        assert completed_by_event == [0], "the event came before the watch: it found nothing"
        assert tries == [False, True], "a first try that saw False, a second that saw True"
        assert op.is_completed() and op.outcome is Outcome.COMPLETED, "the second try must complete it"
        assert results == [True], "completed by the submitting call's second try"
        assert op.completions == 1 and op.expirations == 0
    finally:
        _shutdown_bounded(purgatory)


class _ContendedLock:
    """An RLock that reports when a second thread starts waiting for it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.owner: int | None = None
        self.contended = threading.Event()

    def __enter__(self) -> object:
        if self.owner is not None and self.owner != threading.get_ident():
            self.contended.set()
        self._lock.acquire()
        self.owner = threading.get_ident()
        return self

    def __exit__(self, *exc: object) -> None:
        self.owner = None
        self._lock.release()


def test_kafka_8334_key_event_while_another_thread_holds_the_op_lock_is_not_lost() -> None:
    """KAFKA-8334, second window: thread A is inside the op's try_complete (op lock held, the
    condition still false); thread B makes the condition true and fires the key event. Kafka
    skipped B's attempt (tryLock); here B must wait for the lock and complete the op."""
    purgatory: DelayedOperationPurgatory[Op] = DelayedOperationPurgatory("kafka-8334-lock")
    lock = _ContendedLock()
    op = Op(LONG_DELAY_MS, lock=lock)
    purgatory.try_complete_else_watch(op, ["group-0"])
    a_inside = threading.Event()

    def a_checks_while_b_waits(o: Op) -> None:
        if threading.current_thread().name == "regression-0" and not a_inside.is_set():
            a_inside.set()
            assert lock.contended.wait(JOIN_TIMEOUT_S), "B never waited for the op lock"

    op.hook = a_checks_while_b_waits

    def b() -> None:
        assert a_inside.wait(JOIN_TIMEOUT_S)
        op.ready = True
        purgatory.check_and_complete("group-0")

    try:
        # A's hook runs before A reads `ready`, so A may see it true already; either way exactly
        # one of A and B completes the op, and nobody leaves it to its timeout.
        _run_threads([lambda: purgatory.check_and_complete("group-0"), b], "KAFKA-8334 op lock")
        assert op.done.wait(5), "the key event was lost: the op would wait for its timeout"
        assert op.outcome is Outcome.COMPLETED and op.completions == 1
    finally:
        _shutdown_bounded(purgatory)


def test_kafka_8334_no_completion_is_missed_under_contention() -> None:
    """KAFKA-8334 under load: eight threads submit ops on 32 shared keys while four others make
    conditions true and fire key events; ops sharing a few locks contend on them. Every op has a
    two-minute timeout, so any op not completed when the events are done was missed."""
    purgatory: DelayedOperationPurgatory[Op] = DelayedOperationPurgatory("kafka-8334-load")
    keys = [f"p{i}" for i in range(32)]
    shared_locks = [threading.RLock() for _ in range(8)]
    per_thread, submitters, completers = 1000, 8, 4
    queue: list[tuple[Op, str]] = []
    queue_lock = threading.Lock()
    submitted = threading.Semaphore(0)
    ops: list[Op] = []

    def submit(seed: int) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(seed)
            for _ in range(per_thread):
                op = Op(LONG_DELAY_MS, lock=rng.choice(shared_locks))
                op_keys = rng.sample(keys, 2)
                ops.append(op)
                purgatory.try_complete_else_watch(op, op_keys)
                with queue_lock:
                    queue.append((op, rng.choice(op_keys)))
                submitted.release()

        return run

    def complete(share: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(share):
                assert submitted.acquire(timeout=JOIN_TIMEOUT_S)
                with queue_lock:
                    op, key = queue.pop(random.randrange(len(queue)))
                op.ready = True
                purgatory.check_and_complete(key)

        return run

    total = per_thread * submitters
    try:
        _run_threads(
            [submit(s) for s in range(submitters)]
            + [complete(total // completers) for _ in range(completers)],
            "KAFKA-8334 load",
        )
        missed = [op for op in ops if not op.is_completed()]
        assert not missed, f"{len(missed)} of {total} completions were missed"
        assert all(op.completions == 1 and op.outcome is Outcome.COMPLETED for op in ops)
        assert purgatory.num_delayed() == 0
    finally:
        _shutdown_bounded(purgatory)


# -- KAFKA-19389 --------------------------------------------------------------------------------


def test_kafka_19389_stress_completed_ops_are_not_kept_alive_by_other_watch_keys() -> None:
    """KAFKA-19389 under contention: an op completed through one key stayed referenced (with its
    response) by its other keys until the next purge. Eight threads complete ops watched on two to
    four shared keys through a random one of them, while others expire; the purge never runs
    (huge purge_interval), yet nothing finished may stay watched or reachable."""
    purgatory: DelayedOperationPurgatory[Op] = DelayedOperationPurgatory("kafka-19389", purge_interval=10**9)
    keys: list[Hashable] = [("orders", p) for p in range(16)]
    refs: list[weakref.ref[Op]] = []
    refs_lock = threading.Lock()
    expiring_done = threading.Semaphore(0)

    def worker(seed: int) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(seed)
            backlog: list[tuple[Op, list[Hashable]]] = []
            for i in range(2000):
                op_keys = rng.sample(keys, rng.randint(2, 4))
                expiring = i % 4 == 0
                op = Op(rng.randint(1, 20) if expiring else LONG_DELAY_MS)
                if expiring:
                    op.after_complete = lambda _op: expiring_done.release()
                purgatory.try_complete_else_watch(op, op_keys)
                with refs_lock:
                    refs.append(weakref.ref(op))
                if not expiring:
                    backlog.append((op, op_keys))
                if len(backlog) > 32:
                    ready, ready_keys = backlog.pop(rng.randrange(len(backlog)))
                    ready.ready = True
                    purgatory.check_and_complete(rng.choice(ready_keys))
            for ready, ready_keys in backlog:
                ready.ready = True
                purgatory.check_and_complete(rng.choice(ready_keys))

        return run

    try:
        _run_threads([worker(s) for s in range(8)], "KAFKA-19389 stress")
        for _ in range(8 * 500):
            assert expiring_done.acquire(timeout=JOIN_TIMEOUT_S), "an expiring op never expired"
        assert purgatory.num_delayed() == 0
        assert purgatory.watched() == 0, "finished ops are still watched without a purge"
        gc.collect()
        alive = sum(1 for ref in refs if ref() is not None)
        assert alive == 0, f"{alive} finished operations are still reachable"
    finally:
        _shutdown_bounded(purgatory)


# -- KAFKA-3994 ---------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_kafka_3994_user_code_reentering_on_the_same_key_from_many_threads_does_not_deadlock() -> None:
    """KAFKA-3994: ``tryComplete`` ran under a watcher-list lock; user code took its group lock
    and re-entered the purgatory, while another thread held that group lock and waited for the
    watcher list: a deadlock. Here every key lands in the *same* watcher shard (integer keys equal
    modulo SHARDS), ops lock their group's lock (as Kafka's group coordinator does), and
    try_complete, on_complete and on_expiration all re-enter the purgatory on their own keys —
    from eight threads that also hold group locks while firing events, and from the timer thread.
    Holding any shard lock while calling user code would deadlock; the join bound turns that
    into a failure."""
    groups = 6
    keys = {g: (g * 2 * SHARDS, (g * 2 + 1) * SHARDS) for g in range(groups)}  # hash(int) == int
    assert len({hash(k) % SHARDS for pair in keys.values() for k in pair}) == 1, "one shard for all"
    group_locks = {g: threading.RLock() for g in range(groups)}
    purgatory: DelayedOperationPurgatory[Op] = DelayedOperationPurgatory("kafka-3994")
    everything: list[Op] = []
    everything_lock = threading.Lock()

    def make(group: int, delay_ms: int, generation: int) -> Op:
        op = Op(delay_ms, lock=group_locks[group])
        op.group, op.generation = group, generation  # type: ignore[attr-defined]
        op.hook, op.after_complete = reenter_in_try, reenter_on_finish
        with everything_lock:
            everything.append(op)
        return op

    # Re-entry one level deep per thread: an op re-checking a key re-checks its neighbours, whose
    # try_complete would re-check the key again — without a bound, an endless recursion.
    reentered = threading.local()

    def once(action: Callable[[], None]) -> None:
        if getattr(reentered, "active", False):
            return
        reentered.active = True
        try:
            action()
        finally:
            reentered.active = False

    def reenter_in_try(o: Op) -> None:
        member_key = keys[o.group][1]  # type: ignore[attr-defined]

        def action() -> None:
            purgatory.check_and_complete(member_key)  # a key this very op is watched on
            purgatory.watched()  # every shard lock, from inside user code

        once(action)

    def reenter_on_finish(o: Op) -> None:
        group, generation = o.group, o.generation  # type: ignore[attr-defined]

        def action() -> None:
            if generation < 2 and not purgatory.closed:
                follow_up = make(group, o.delay_ms, generation + 1)
                follow_up.ready = o.outcome is Outcome.COMPLETED
                purgatory.try_complete_else_watch(follow_up, list(keys[group]))
            purgatory.check_and_complete(keys[group][0])

        once(action)

    def worker(seed: int) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(seed)
            for _ in range(OPS_PER_THREAD_3994):
                group = rng.randrange(groups)
                expiring = rng.random() < 0.3
                op = make(group, rng.randint(1, 10) if expiring else 5_000, 0)
                with group_locks[group]:  # submit and fire events holding the group lock
                    purgatory.try_complete_else_watch(op, list(keys[group]))
                    if not expiring:
                        op.ready = True
                        purgatory.check_and_complete(rng.choice(keys[group]))

        return run

    try:

        def finished() -> int:
            with everything_lock:
                return sum(op.completions for op in everything)

        _run_threads([worker(s) for s in range(8)], "KAFKA-3994 re-entry", progress=finished)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while time.monotonic() < deadline:
            with everything_lock:
                snapshot = list(everything)
            pending = [op for op in snapshot if not op.done.wait(max(0.0, deadline - time.monotonic()))]
            with everything_lock:
                grown = len(everything) > len(snapshot)
            if not pending and not grown:
                break
        assert not pending, f"{len(pending)} operations never finished (a wedged thread?)"
        assert all(op.completions == 1 for op in everything), "each finished exactly once"
        outcomes = {op.outcome for op in everything}
        assert outcomes == {Outcome.COMPLETED, Outcome.EXPIRED}, outcomes
        assert len(everything) > 8 * OPS_PER_THREAD_3994, "the callbacks re-entered and submitted follow-ups"
    finally:
        _shutdown_bounded(purgatory)


# -- the bound itself ----------------------------------------------------------------------------


def test_the_stall_bound_fails_a_hang_and_lets_slow_progress_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound on the KAFKA-3994 threads fails work that stops (a deadlock) and lets work that
    goes on longer than the bound, but keeps advancing (a loaded machine), finish. The slow
    worker takes a step per look at its progress, so it outlasts the bound whatever the load."""
    monkeypatch.setattr(sys.modules[__name__], "JOIN_TIMEOUT_S", 2.0)
    monkeypatch.setattr(sys.modules[__name__], "PROGRESS_CHECK_S", 0.02)
    looks = threading.Semaphore(0)
    steps = [0]
    total = 150  # >= 150 looks, 0.02 s apart: at least 3 s, longer than the 2 s bound

    def progress() -> int:
        looks.release()
        return steps[0]

    def slow() -> None:
        for _ in range(total):
            assert looks.acquire(timeout=60), "the join stopped looking"
            steps[0] += 1

    started = time.monotonic()
    _run_threads([slow], "slow", progress=progress)
    assert steps[0] == total and time.monotonic() - started > 2.0, "it outlasted the bound and finished"
    release = threading.Event()
    try:
        with pytest.raises(AssertionError, match="without progress"):
            _run_threads([lambda: release.wait(60)], "hung", progress=lambda: steps[0])
    finally:
        release.set()
