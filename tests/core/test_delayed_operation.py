"""Port of Kafka's DelayedOperationTest, plus the exactly-once claim of docs/design.md §3.2."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from purgatory import DelayedOperationPurgatory, Outcome
from purgatory._operation_core import DEPTH_MAX
from purgatory.testing import MockTimer

from .ops import MockDelayedOperation


@pytest.fixture
def purgatory() -> Iterator[DelayedOperationPurgatory[MockDelayedOperation]]:
    p: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory("mock")
    yield p
    p.shutdown()


@pytest.fixture
def mock_timer() -> MockTimer:
    return MockTimer()


@pytest.fixture
def mock_purgatory(mock_timer: MockTimer) -> Iterator[DelayedOperationPurgatory[MockDelayedOperation]]:
    p: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "mock", timer=mock_timer, reaper_enabled=False
    )
    yield p
    p.shutdown()


def test_request_satisfaction(mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation]) -> None:
    r1 = MockDelayedOperation(100_000)
    r2 = MockDelayedOperation(100_000)
    assert mock_purgatory.check_and_complete("test1") == 0, (
        "With no waiting requests, nothing should be satisfied"
    )
    assert not mock_purgatory.try_complete_else_watch(r1, ["test1"]), "r1 not satisfied and hence watched"
    assert mock_purgatory.check_and_complete("test1") == 0, "Still nothing satisfied"
    assert not mock_purgatory.try_complete_else_watch(r2, ["test2"]), "r2 not satisfied and hence watched"
    assert mock_purgatory.check_and_complete("test2") == 0, "Still nothing satisfied"
    r1.completable = True
    assert mock_purgatory.check_and_complete("test1") == 1, "r1 satisfied"
    assert mock_purgatory.check_and_complete("test1") == 0, "Nothing satisfied"
    r2.completable = True
    assert mock_purgatory.check_and_complete("test2") == 1, "r2 satisfied"
    assert mock_purgatory.check_and_complete("test2") == 0, "Nothing satisfied"
    assert r1.outcome is Outcome.COMPLETED and r1.completions == 1 and r1.expirations == 0


CLOCK_RESOLUTION_MS = 1  # SystemTimer reads time.monotonic_ns() // 1_000_000


def test_request_expiry(purgatory: DelayedOperationPurgatory[MockDelayedOperation]) -> None:
    expiration_ms = 20
    start = time.monotonic()
    r1 = MockDelayedOperation(expiration_ms)
    r2 = MockDelayedOperation(200_000)
    assert not purgatory.try_complete_else_watch(r1, ["test1"]), "r1 not satisfied and hence watched"
    assert not purgatory.try_complete_else_watch(r2, ["test2"]), "r2 not satisfied and hence watched"
    assert r1.await_finish(5)
    elapsed_ms = (time.monotonic() - start) * 1000
    assert r1.is_completed(), "r1 completed due to expiration"
    assert not r2.is_completed(), "r2 hasn't completed"
    # The timer's clock counts whole milliseconds (as Kafka's): an op submitted at 100.9 ms reads
    # 100 and is due at 120, 19.1 ms later. Early by less than one tick, never by more.
    assert elapsed_ms > expiration_ms - CLOCK_RESOLUTION_MS, (
        f"Time for expiration {elapsed_ms} should at least {expiration_ms} (less one clock tick)"
    )
    assert r1.outcome is Outcome.EXPIRED
    assert r1.completions == 1 and r1.expirations == 1


def test_request_expiry_on_mock_timer_is_exact(
    mock_timer: MockTimer, mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation]
) -> None:
    r1 = MockDelayedOperation(20)
    mock_purgatory.try_complete_else_watch(r1, ["k"])
    mock_timer.advance_clock(19)
    assert not r1.is_completed(), "not due before its timeout"
    mock_timer.advance_clock(1)
    assert r1.outcome is Outcome.EXPIRED and r1.expirations == 1


def test_request_purge(mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation]) -> None:
    r1 = MockDelayedOperation(100_000)
    r2 = MockDelayedOperation(100_000)
    r3 = MockDelayedOperation(100_000)
    mock_purgatory.try_complete_else_watch(r1, ["test1"])
    mock_purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    mock_purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert mock_purgatory.num_delayed() == 3, "Purgatory should have 3 total delayed operations"
    assert mock_purgatory.watched() == 6, "Purgatory should have 6 watched elements"

    # complete the operations, it should immediately be purged from the delayed operation
    r2.completable = True
    r2.try_complete()
    assert mock_purgatory.num_delayed() == 2, "Purgatory should have 2 total delayed operations"
    r3.completable = True
    r3.try_complete()
    assert mock_purgatory.num_delayed() == 1, "Purgatory should have 1 total delayed operations"

    # Kafka keeps r2 and r3 in their watch lists until a check or purge finds them (6 watched
    # here). We unwatch finished operations from every key at once (KAFKA-19389), so only r1's
    # entry is left — and checking the keys changes nothing.
    assert mock_purgatory.watched() == 1, "finished operations leave every watch list at once"
    for key in ("test1", "test2", "test3"):
        assert mock_purgatory.check_and_complete(key) == 0
        assert mock_purgatory.watched() == 1, "Purgatory should have 1 watched elements"


def test_completed_operation_is_not_kept_alive_by_its_other_watch_keys(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    """KAFKA-19389: an op completed through one key stayed referenced (with its response data)
    by its other keys until the next purge."""
    import gc
    import weakref

    op = MockDelayedOperation(100_000)
    mock_purgatory.try_complete_else_watch(op, ["group", "partition"])
    op.completable = True
    assert mock_purgatory.check_and_complete("group") == 1
    ref = weakref.ref(op)
    del op
    gc.collect()
    assert ref() is None, "no watch list may keep a completed operation alive"
    assert mock_purgatory.watched() == 0


def test_reaper_step_purges_completed_operations_past_the_purge_interval(mock_timer: MockTimer) -> None:
    p: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "purge", timer=mock_timer, reaper_enabled=False, purge_interval=2
    )
    ops = [MockDelayedOperation(100_000) for _ in range(4)]
    for op in ops:
        p.try_complete_else_watch(op, ["a", "b"])
    for op in ops[:3]:
        # Simulate a watch that raced the finish: the op stays in its lists until a purge.
        op._watch = None
        op.force_complete()
    assert p.watched() == 8, "entries that escaped the eager unwatch linger until purged"
    p.advance_clock(0)
    assert p.watched() == 2, "3 completed > purge_interval 2: purged from every key"
    p.shutdown()


def test_should_cancel_for_key_returning_cancelled_operations(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    mock_purgatory.try_complete_else_watch(MockDelayedOperation(10_000), ["key"])
    mock_purgatory.try_complete_else_watch(MockDelayedOperation(10_000), ["key"])
    mock_purgatory.try_complete_else_watch(MockDelayedOperation(10_000), ["key2"])
    cancelled = mock_purgatory.cancel_for_key("key")
    assert len(cancelled) == 2
    assert all(not op.is_completed() for op in cancelled), "cancel_for_key does not finish operations"
    assert mock_purgatory.num_delayed() == 1
    assert mock_purgatory.watched() == 1


def test_should_return_no_operations_on_cancel_for_key_when_key_doesnt_exist(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    assert mock_purgatory.cancel_for_key("key") == []


def test_cancel_for_key_operations_are_left_to_the_caller_by_drain(mock_timer: MockTimer) -> None:
    p: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory(
        "drain", timer=mock_timer, reaper_enabled=False
    )
    kept = MockDelayedOperation(10_000)
    handed_back = MockDelayedOperation(10_000)
    p.try_complete_else_watch(kept, ["a"])
    p.try_complete_else_watch(handed_back, ["b"])
    assert p.cancel_for_key("b") == [handed_back]
    mock_timer.advance_clock(20_000)
    assert not handed_back.is_completed(), "no longer timed after cancel_for_key"
    assert kept.outcome is Outcome.EXPIRED
    p.shutdown()
    assert not handed_back.is_completed(), "drain leaves cancel_for_key operations alone"


def test_try_complete_with_multiple_threads() -> None:
    """Kafka's 20-thread stress: 100 ops, each complete only on its 20th attempt."""
    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory("stress")
    completion_attempts = 20
    max_delay_ms = 10

    class TestDelayOperation(MockDelayedOperation):
        def __init__(self, index: int) -> None:
            super().__init__(10_000)
            self.key = f"key{index}"
            self._remaining = completion_attempts
            self._remaining_lock = threading.Lock()

        def try_complete(self) -> bool:
            with self._remaining_lock:
                self._remaining -= 1
                should_complete = self._remaining <= 0
            if should_complete:
                self.force_complete()
            return should_complete

    ops = [TestDelayOperation(i) for i in range(100)]
    for op in ops:
        purgatory.try_complete_else_watch(op, [op.key])
    rng = random.Random(1)
    barriers = [
        (rng.random() * max_delay_ms / 1000, op.key) for _ in range(completion_attempts) for op in ops
    ]
    rng.shuffle(barriers)

    def attempt(delay_and_key: tuple[float, str]) -> int:
        time.sleep(delay_and_key[0] / 100)  # spread the calls, not synchronisation
        return purgatory.check_and_complete(delay_and_key[1])

    with ThreadPoolExecutor(max_workers=20) as executor:
        finished = sum(executor.map(attempt, barriers))
    for op in ops:
        assert op.is_completed(), f"Operation {op.key} should have completed"
        assert op.completions == 1
    assert finished == len(ops), "each op is counted by exactly one check_and_complete"
    purgatory.shutdown()


def test_delayed_operation_lock_is_held_while_trying(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    """testDelayedOperationLock: try_complete runs under op.lock (a shared lock if one was given)."""
    shared = threading.RLock()
    ops = [MockDelayedOperation(100_000, lock=shared) for _ in range(2)]
    held: list[bool] = []

    def probe() -> None:
        # An RLock is owned by the current thread iff acquiring it from another thread fails.
        outcome: list[bool] = []
        t = threading.Thread(target=lambda: outcome.append(shared.acquire(blocking=False)))
        t.start()
        t.join()
        held.append(not outcome[0])

    for op in ops:
        op.on_try = probe
        mock_purgatory.try_complete_else_watch(op, ["key"])
    mock_purgatory.check_and_complete("key")
    assert held and all(held), "try_complete must run with op.lock held"
    assert len(held) == 2 * 2 + 2, "two tries on submit, one per check, for each op"


def test_force_complete_inside_try_complete_with_a_plain_lock_does_not_deadlock(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    op = MockDelayedOperation(100_000, lock=threading.Lock())
    op.completable = True
    assert mock_purgatory.try_complete_else_watch(op, ["k"]) is True
    assert op.completions == 1


def test_safe_try_complete_or_else_runs_the_action_between_two_tries() -> None:
    op = MockDelayedOperation(1000)
    calls: list[str] = []
    op.on_try = lambda: calls.append("try")
    assert op.safe_try_complete_or_else(lambda: calls.append("action")) is False
    assert calls == ["try", "action", "try"]
    op.completable = True
    assert op.safe_try_complete_or_else(lambda: calls.append("action")) is True
    assert calls[-1] == "try" and calls.count("action") == 1, "no action when the first try completes"


def test_safe_try_complete_is_false_once_completed() -> None:
    op = MockDelayedOperation(1000)
    assert op.force_complete()
    op.completable = True
    assert op.safe_try_complete() is False
    assert op.try_calls == 0, "a completed operation is not tried again"


def test_exactly_one_of_racing_finishers_wins() -> None:
    for _ in range(200):
        op = MockDelayedOperation(1000)
        start = threading.Barrier(3)
        results: list[bool] = []

        def complete(
            op: MockDelayedOperation = op, start: threading.Barrier = start, results: list[bool] = results
        ) -> None:
            start.wait()
            results.append(op.force_complete())

        def expire(
            op: MockDelayedOperation = op, start: threading.Barrier = start, results: list[bool] = results
        ) -> None:
            start.wait()
            results.append(op._expire())

        threads = [threading.Thread(target=complete), threading.Thread(target=expire)]
        for t in threads:
            t.start()
        start.wait()
        for t in threads:
            t.join()
        assert sorted(results) == [False, True]
        assert op.completions == 1
        assert op.expirations == (1 if op.outcome is Outcome.EXPIRED else 0)


def test_outcome_is_set_before_on_complete_runs() -> None:
    seen: list[Outcome | None] = []

    class Probe(MockDelayedOperation):
        def on_complete(self) -> None:
            seen.append(self.outcome)

    op = Probe(10)
    assert op.outcome is None and not op.is_completed()
    op.run()
    assert seen == [Outcome.EXPIRED]
    assert op.force_complete() is False


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (-1, ValueError),
        (1.5, TypeError),
        ("10", TypeError),
        (True, TypeError),
        (float("nan"), TypeError),
        (float("inf"), TypeError),
        (2**63, ValueError),  # past Kafka's long delayMs: accepted and timed once
    ],
)
def test_bad_delay_is_refused(delay: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="delay_ms"):
        MockDelayedOperation(delay)  # type: ignore[arg-type]


# -- the operation's own lock (the default op.lock, an RLock kept in two fields) -----------------


def _held_elsewhere(lock: object) -> bool:
    """True iff another thread cannot take ``lock`` now (it is held by this or some thread)."""
    got: list[bool] = []

    def probe() -> None:
        ok = lock.acquire(blocking=False)  # type: ignore[attr-defined]
        if ok:
            lock.release()  # type: ignore[attr-defined]
        got.append(ok)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return not got[0]


def test_own_lock_is_held_while_trying_on_submit_and_check(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    op = MockDelayedOperation(100_000)
    held: list[bool] = []
    op.on_try = lambda: held.append(_held_elsewhere(op.lock))
    mock_purgatory.try_complete_else_watch(op, ["key"])
    mock_purgatory.check_and_complete("key")
    assert held == [True, True, True], "try_complete must run with the op's own lock held"
    assert not _held_elsewhere(op.lock), "released after each try"


def test_own_lock_is_reentrant_and_the_same_object_every_time() -> None:
    op = MockDelayedOperation(1000)
    lock = op.lock
    assert op.lock is lock, "op.lock is one object"
    with lock:
        assert lock.acquire(blocking=False), "the holder may take it again"
        op.completable = True
        assert op.safe_try_complete() is True, "try_complete may run while user code holds op.lock"
        lock.release()
        assert _held_elsewhere(lock), "still held once: released once of twice"
    assert not _held_elsewhere(lock)


def test_own_lock_refuses_a_level_past_its_depth_limit_and_stays_usable() -> None:
    """The depth shares the lock's state word with the owner's thread ident: past DEPTH_MAX
    levels a further acquire raises OverflowError (as RLock's count overflow) instead of
    spilling into the owner bits."""
    op = MockDelayedOperation(1000)
    lock = op.lock
    for _ in range(DEPTH_MAX):
        assert lock.acquire()
    with pytest.raises(OverflowError, match="own lock"):
        lock.acquire()
    for _ in range(DEPTH_MAX):
        assert _held_elsewhere(lock)
        lock.release()
    assert not _held_elsewhere(lock)
    with lock:
        assert lock.acquire(blocking=False)
        lock.release()


def test_own_lock_blocks_other_threads_until_released() -> None:
    op = MockDelayedOperation(1000)
    op.completable = True
    started = threading.Event()
    result: list[bool] = []

    def other() -> None:
        started.set()
        result.append(op.safe_try_complete())

    with op.lock:
        t = threading.Thread(target=other)
        t.start()
        assert started.wait(5)
        t.join(0.2)
        assert t.is_alive(), "safe_try_complete waits for op.lock held by another thread"
        assert op.completions == 0
    t.join(5)
    assert result == [True] and op.completions == 1


def test_own_lock_refuses_release_by_a_thread_not_holding_it() -> None:
    op = MockDelayedOperation(1000)
    with pytest.raises(RuntimeError, match="un-acquired"):
        op.lock.release()
    errors: list[BaseException] = []
    with op.lock:

        def release_elsewhere() -> None:
            try:
                op.lock.release()
            except RuntimeError as exc:
                errors.append(exc)

        t = threading.Thread(target=release_elsewhere)
        t.start()
        t.join()
    assert len(errors) == 1, "only the holder may release op.lock"


def test_own_lock_acquire_times_out_and_non_blocking_fails_while_held() -> None:
    op = MockDelayedOperation(1000)
    outcomes: list[bool] = []
    with op.lock:

        def contend() -> None:
            outcomes.append(op.lock.acquire(blocking=False))
            outcomes.append(op.lock.acquire(timeout=0.05))

        t = threading.Thread(target=contend)
        t.start()
        t.join()
    assert outcomes == [False, False]
    assert op.lock.acquire(timeout=0.05), "free again"
    op.lock.release()


def test_condition_on_own_lock_waits_with_the_lock_held_twice() -> None:
    op = MockDelayedOperation(1000)
    cond = threading.Condition(op.lock)
    ready: list[bool] = []

    def notifier() -> None:
        with cond:
            ready.append(True)
            cond.notify()

    with op.lock, cond:  # held twice: wait() must release both levels, then restore them
        t = threading.Thread(target=notifier)
        t.start()
        assert cond.wait_for(lambda: bool(ready), timeout=5)
        assert _held_elsewhere(op.lock)
    t.join()
    assert not _held_elsewhere(op.lock), "both levels released"


def test_own_lock_stress_mutual_exclusion() -> None:
    """Eight threads take one op's own lock (re-entering it) 2,000 times each; a counter updated
    non-atomically inside must end exact: the window is the owner check and the store."""
    op = MockDelayedOperation(1000)
    box = [0]

    def work() -> None:
        for _ in range(2000):
            with op.lock, op.lock:
                value = box[0]
                if value % 97 == 0:
                    time.sleep(0)  # hand the GIL over inside the critical section
                box[0] = value + 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert box[0] == 8 * 2000
    assert not _held_elsewhere(op.lock)


def test_finished_operations_leave_no_entries_or_keys_behind(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    """Watch lists are append-only with a dead count (compacted once half dead): a key whose ops
    all finished must still be dropped, or one-op keys (correlation ids) would pile up."""
    ops = [MockDelayedOperation(100_000) for _ in range(1000)]
    for i, op in enumerate(ops):
        mock_purgatory.try_complete_else_watch(op, [f"corr-{i}", "shared"])
    for op in ops:
        op.force_complete()
    assert mock_purgatory.watched() == 0
    left = {key: len(w.ops) for shard in mock_purgatory._shards for key, w in shard.watchers_by_key.items()}
    assert left == {}, f"keys or dead entries left behind: {left}"


def test_a_key_given_twice_is_watched_once(
    mock_purgatory: DelayedOperationPurgatory[MockDelayedOperation],
) -> None:
    op = MockDelayedOperation(100_000)
    mock_purgatory.try_complete_else_watch(op, ["a", "b", "a"])
    assert mock_purgatory.watched() == 2
    op.completable = True
    assert mock_purgatory.check_and_complete("a") == 1
    assert mock_purgatory.watched() == 0
