"""DelayedOperationPurgatory beyond Kafka (docs/design.md §3.3, §3.4): isolation, drain, limits, bad input."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import pytest
from structlog.testing import capture_logs

from purgatory import (
    DelayedOperationPurgatory,
    Outcome,
    PurgatoryClosedError,
    PurgatoryError,
    PurgatoryFullError,
    SystemTimer,
)
from purgatory._metrics import live_purgatories
from purgatory.testing import MockTimer

from .ops import MockDelayedOperation

Purgatory = DelayedOperationPurgatory[MockDelayedOperation]


@pytest.fixture
def timer() -> MockTimer:
    return MockTimer()


@pytest.fixture
def purgatory(timer: MockTimer) -> Iterator[Purgatory]:
    p: Purgatory = DelayedOperationPurgatory("unit", timer=timer, reaper_enabled=False)
    yield p
    p.shutdown()


# -- bad input ---------------------------------------------------------------------------------


def test_empty_key_list_is_refused(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(100)
    with pytest.raises(ValueError, match="at least one watch key"):
        purgatory.try_complete_else_watch(op, [])
    assert purgatory.watched() == 0 and purgatory.num_delayed() == 0


def test_unhashable_key_is_refused_before_anything_is_watched(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(100)
    with pytest.raises(TypeError, match=r"watch key \['x'\] of type list is unhashable"):
        purgatory.try_complete_else_watch(op, ["fine", ["x"]])
    assert purgatory.watched() == 0, "nothing watched when a later key is bad"
    assert op.try_calls == 0


@pytest.mark.parametrize("kind", [list, tuple, iter, collections.deque])
def test_keys_of_any_collection_are_checked_watched_and_released_alike(
    purgatory: Purgatory, kind: Callable[[list[str]], Iterable[str]]
) -> None:
    """Compiled, the loops over an operation's keys have one branch per type (list, tuple, any
    other iterable): each branch watches on every key, and the finish releases every key."""
    with pytest.raises(TypeError, match=r"watch key \['x'\] of type list is unhashable"):
        purgatory.try_complete_else_watch(MockDelayedOperation(100), kind(["fine", ["x"]]))  # type: ignore[list-item]
    op = MockDelayedOperation(100)
    assert not purgatory.try_complete_else_watch(op, kind(["a", "b", "c"]))
    assert purgatory.watched() == 3
    op.completable = True
    assert purgatory.check_and_complete("c") == 1
    assert op.completions == 1
    assert purgatory.watched() == 0, "the finish released the op from every key"
    assert all(purgatory.check_and_complete(key) == 0 for key in "abc")


@pytest.mark.parametrize("keys", [None, 5])
def test_keys_that_are_not_a_collection_are_refused_naming_keys(purgatory: Purgatory, keys: object) -> None:
    op = MockDelayedOperation(100)
    with pytest.raises(TypeError, match="keys must be a collection of watch keys"):
        purgatory.try_complete_else_watch(op, keys)  # type: ignore[arg-type]
    assert purgatory.watched() == 0 and purgatory.num_delayed() == 0 and op.try_calls == 0


def test_operation_finished_before_submission_is_not_kept(purgatory: Purgatory, timer: MockTimer) -> None:
    """Kafka's performance tool completes some requests before submitting them: Kafka's
    tryCompleteElseWatch returns false and keeps nothing (docs/design.md §3.3). It used to raise
    InvalidOperationError."""
    op = MockDelayedOperation(100)
    assert op.force_complete()
    assert purgatory.try_complete_else_watch(op, ["k", "j", "i"]) is False
    assert purgatory.watched() == 0, "a finished operation is watched on no key"
    assert purgatory.num_delayed() == 0, "a finished operation is not timed"
    assert op.try_calls == 0, "a finished operation's try_complete is not called"
    assert purgatory.check_and_complete("k") == 0
    timer.advance_clock(200)
    assert (op.completions, op.expirations, op.outcome) == (1, 0, Outcome.COMPLETED)
    assert purgatory.stats.as_dict()["expired"] == 0


def test_operation_finished_before_submission_is_not_kept_on_resubmit(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(100)
    assert purgatory.try_complete_else_watch(op, ["k"]) is False
    assert op.force_complete()
    assert purgatory.try_complete_else_watch(op, ["k"]) is False
    assert purgatory.watched() == 0 and purgatory.num_delayed() == 0
    assert op.completions == 1


def test_use_after_shutdown_is_refused(timer: MockTimer) -> None:
    p: Purgatory = DelayedOperationPurgatory("closed", timer=timer, reaper_enabled=False)
    p.shutdown()
    p.shutdown()  # idempotent
    with pytest.raises(PurgatoryClosedError, match="closed"):
        p.try_complete_else_watch(MockDelayedOperation(100), ["k"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"purge_interval": -1}, "purge_interval"),
        ({"max_pending": 0}, "max_pending"),
        ({"max_pending_per_key": 0}, "max_pending_per_key"),
        ({"max_pending_per_key": True}, "max_pending_per_key"),
        ({"reaper_poll_ms": 0}, "reaper_poll_ms"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_purgatory_configuration_is_refused(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"name": "bad", "reaper_enabled": False, "timer": MockTimer(), **kwargs}
    with pytest.raises(ValueError, match=field):
        DelayedOperationPurgatory(**args)  # type: ignore[arg-type]


# -- user code isolation -----------------------------------------------------------------------


class _Failing(MockDelayedOperation):
    def __init__(self, delay_ms: int, fail_in: str, fail_on_try: int = 1) -> None:
        super().__init__(delay_ms)
        self.fail_in = fail_in
        self.fail_on_try = fail_on_try

    def try_complete(self) -> bool:
        self.try_calls += 1
        if self.fail_in == "try_complete" and self.try_calls >= self.fail_on_try:
            raise RuntimeError("try_complete failed")
        return self.force_complete() if self.completable else False

    def on_complete(self) -> None:
        super().on_complete()
        if self.fail_in == "on_complete":
            raise RuntimeError("on_complete failed")

    def on_expiration(self) -> None:
        super().on_expiration()
        if self.fail_in == "on_expiration":
            raise RuntimeError("on_expiration failed")


def test_try_complete_raising_on_submit_propagates_and_nothing_is_watched(purgatory: Purgatory) -> None:
    op = _Failing(100, "try_complete")
    with pytest.raises(RuntimeError, match="try_complete failed"):
        purgatory.try_complete_else_watch(op, ["k"])
    assert purgatory.watched() == 0 and purgatory.num_delayed() == 0


def test_second_try_raising_unwatches_the_operation(purgatory: Purgatory) -> None:
    op = _Failing(100, "try_complete", fail_on_try=2)
    with pytest.raises(RuntimeError):
        purgatory.try_complete_else_watch(op, ["a", "b"])
    assert purgatory.watched() == 0, "the op is unwatched again before the error propagates"
    assert purgatory.num_delayed() == 0


def test_try_complete_raising_in_check_and_complete_is_isolated(
    timer: MockTimer, purgatory: Purgatory
) -> None:
    bad = _Failing(100, "try_complete", fail_on_try=3)
    good = MockDelayedOperation(100)
    purgatory.try_complete_else_watch(bad, ["k"])
    purgatory.try_complete_else_watch(good, ["k"])
    good.completable = True
    with capture_logs() as logs:
        assert purgatory.check_and_complete("k") == 1, "the other ops on the key are still checked"
    assert good.outcome is Outcome.COMPLETED
    assert any(e["event"] == "user_callback_failed" and e["callback"] == "try_complete" for e in logs)
    assert purgatory.stats.user_code_errors == 1
    assert purgatory.watched() == 1 and purgatory.num_delayed() == 1, "the failing op stays watched and timed"
    timer.advance_clock(100)
    assert bad.outcome is Outcome.EXPIRED and bad.completions == 1


@pytest.mark.parametrize("where", ["on_complete", "on_expiration"])
def test_completion_callbacks_raising_still_finish_once(
    timer: MockTimer, purgatory: Purgatory, where: str
) -> None:
    op = _Failing(10, where)
    purgatory.try_complete_else_watch(op, ["k"])
    with capture_logs() as logs:
        timer.advance_clock(10)
    assert op.outcome is Outcome.EXPIRED
    assert op.completions == 1 and op.expirations == 1, "on_expiration still runs after on_complete failed"
    assert [e["callback"] for e in logs if e["event"] == "user_callback_failed"] == [where]
    assert purgatory.stats.user_code_errors == 1
    assert purgatory.stats.expired == 1


def test_reaper_survives_user_code_failures_on_a_system_timer() -> None:
    p: Purgatory = DelayedOperationPurgatory("isolated")
    failing = _Failing(5, "on_complete")
    after = MockDelayedOperation(10)
    p.try_complete_else_watch(failing, ["k"])
    p.try_complete_else_watch(after, ["k"])
    assert after.await_finish(5), "later expirations still happen after a failing callback"
    assert failing.completions == 1
    p.shutdown()


# -- shutdown ----------------------------------------------------------------------------------


def test_shutdown_drains_pending_operations_as_expired() -> None:
    p: Purgatory = DelayedOperationPurgatory("drain")
    ops = [MockDelayedOperation(600_000) for _ in range(10)]
    for i, op in enumerate(ops):
        p.try_complete_else_watch(op, [f"k{i % 3}", "shared"])
    p.shutdown()
    assert all(op.outcome is Outcome.EXPIRED for op in ops)
    assert all(op.completions == 1 and op.expirations == 1 for op in ops)
    reaper_alive = [t.name for t in threading.enumerate() if t.name.startswith("ExpirationReaper-0-drain")]
    assert reaper_alive == []


def test_shutdown_without_drain_leaves_operations_unexecuted() -> None:
    p: Purgatory = DelayedOperationPurgatory("nodrain")
    op = MockDelayedOperation(600_000)
    p.try_complete_else_watch(op, ["k"])
    p.shutdown(drain=False)
    assert not op.is_completed(), "Kafka's behaviour: pending operations are left unexecuted"


def test_shutdown_wakes_the_reaper_at_once() -> None:
    p: Purgatory = DelayedOperationPurgatory("wake", reaper_poll_ms=60_000)
    done = threading.Event()
    t = threading.Thread(target=lambda: (p.shutdown(), done.set()))
    t.start()
    assert done.wait(5), "shutdown must not wait for the reaper's poll timeout"
    t.join()


def test_shutdown_closes_an_owned_timer_but_not_a_borrowed_one() -> None:
    borrowed = SystemTimer("borrowed")
    p: Purgatory = DelayedOperationPurgatory("borrower", timer=borrowed)
    p.shutdown()
    assert not borrowed.closed, "a timer passed in belongs to the caller"
    borrowed.close()
    owner: Purgatory = DelayedOperationPurgatory("owner")
    owner.shutdown()
    assert not any(t.name == "executor-owner" for t in threading.enumerate())


def _race_submissions_against_shutdown(name: str) -> None:
    p: Purgatory = DelayedOperationPurgatory(name)
    accepted: list[MockDelayedOperation] = []
    refused: list[MockDelayedOperation] = []
    go = threading.Event()

    def submit() -> None:
        go.wait()
        for _ in range(200):
            op = MockDelayedOperation(600_000)
            try:
                p.try_complete_else_watch(op, ["k", "j"])
                accepted.append(op)
            except PurgatoryClosedError:
                refused.append(op)

    threads = [threading.Thread(target=submit) for _ in range(3)]
    for t in threads:
        t.start()
    go.set()
    p.shutdown()
    for t in threads:
        t.join()
    lost = [op for op in accepted if not op.is_completed()]
    assert lost == [], f"{len(lost)} accepted operations were neither finished nor refused"
    assert all(op.completions == 1 for op in accepted)
    assert len(accepted) + len(refused) == 600


def test_submissions_racing_shutdown_are_refused_or_drained_never_lost() -> None:
    for round_ in range(20):
        _race_submissions_against_shutdown(f"race{round_}")


def test_metrics_registered_at_construction_and_removed_at_shutdown(timer: MockTimer) -> None:
    p: Purgatory = DelayedOperationPurgatory("metrics", timer=timer, reaper_enabled=False)
    assert p in live_purgatories()
    p.shutdown()
    assert p not in live_purgatories()


# -- max_pending -------------------------------------------------------------------------------


def test_max_pending_refuses_new_operations_with_a_typed_error(timer: MockTimer) -> None:
    p: Purgatory = DelayedOperationPurgatory("bounded", timer=timer, reaper_enabled=False, max_pending=2)
    p.try_complete_else_watch(MockDelayedOperation(100), ["k"])
    p.try_complete_else_watch(MockDelayedOperation(100), ["k"])
    third = MockDelayedOperation(100)
    with pytest.raises(PurgatoryFullError) as info:
        p.try_complete_else_watch(third, ["k"])
    assert isinstance(info.value, PurgatoryError)
    assert info.value.max_pending == 2 and "max_pending=2" in str(info.value)
    assert p.watched() == 2 and p.num_delayed() == 2, "the refused op is neither watched nor timed"
    completing = MockDelayedOperation(100)
    completing.completable = True
    assert p.try_complete_else_watch(completing, ["k"]), "an op completing on its first try is accepted"
    timer.advance_clock(100)
    assert p.try_complete_else_watch(MockDelayedOperation(100), ["k"]) is False, "room again after expiry"
    p.shutdown()


def test_max_pending_per_key_refuses_a_waiter_on_a_full_key_only(timer: MockTimer) -> None:
    p: Purgatory = DelayedOperationPurgatory(
        "per-key", timer=timer, reaper_enabled=False, max_pending_per_key=2
    )
    first, second = MockDelayedOperation(100), MockDelayedOperation(100)
    p.try_complete_else_watch(first, ["hot"])
    p.try_complete_else_watch(second, ["hot", "other"])
    refused = MockDelayedOperation(100)
    with pytest.raises(PurgatoryFullError) as info:
        p.try_complete_else_watch(refused, ["cold", "hot"])
    assert info.value.key == "hot" and info.value.max_pending == 2 and info.value.pending == 2
    assert "max_pending_per_key=2" in str(info.value) and "'hot'" in str(info.value)
    assert p.watched() == 3 and p.num_delayed() == 2, "the refused op is neither watched nor timed on any key"
    assert p.try_complete_else_watch(MockDelayedOperation(100), ["other"]) is False, "other keys still admit"
    first.completable = True
    assert p.check_and_complete("hot") == 1
    assert p.try_complete_else_watch(MockDelayedOperation(100), ["hot"]) is False, (
        "room again once one finished"
    )
    p.shutdown()


def test_max_pending_per_key_comes_from_settings_with_per_purgatory_overrides() -> None:
    from purgatory.settings import Settings

    settings = Settings(max_pending_per_key=7, purgatories={"fetch": {"max_pending_per_key": 3}})
    fetch = DelayedOperationPurgatory.from_settings("fetch", settings, reaper_enabled=False)
    produce = DelayedOperationPurgatory.from_settings("produce", settings, reaper_enabled=False)
    try:
        assert (fetch.max_pending_per_key, produce.max_pending_per_key) == (3, 7)
    finally:
        fetch.shutdown()
        produce.shutdown()


# -- keys --------------------------------------------------------------------------------------


def test_any_hashable_value_is_a_key(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(1000)
    keys = [("orders", 3), 42, frozenset({"a"}), None]
    purgatory.try_complete_else_watch(op, keys)
    assert purgatory.watched() == 4
    op.completable = True
    assert purgatory.check_and_complete(("orders", 3)) == 1
    for key in keys[1:]:
        assert purgatory.check_and_complete(key) == 0
    assert purgatory.watched() == 0, "checking a key removes completed ops and the empty key"


class _FinishingKey:
    """A key whose second hash finishes ``op``: that hash is the one the watch loop takes just
    before inserting the op under this key (the first is the up-front hashability check). It
    stands for another thread calling force_complete while the submitter is mid-loop."""

    def __init__(self, name: str, op: MockDelayedOperation) -> None:
        self.name, self.op, self.hashes = name, op, 0

    def __hash__(self) -> int:
        self.hashes += 1
        if self.hashes == 2:
            self.op.force_complete()
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FinishingKey) and other.name == self.name


class _ValueEqual(MockDelayedOperation):
    """Compares by value (like a dataclass): two of them are equal, and unhashable."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ValueEqual)

    __hash__ = None  # type: ignore[assignment]


def test_operations_comparing_by_value_are_watched_each_on_its_own(purgatory: Purgatory) -> None:
    """Watch entries are keyed by the op itself only for identity-compared classes; equal ops
    of a value-compared class must not share one entry."""
    ops = [_ValueEqual(1000), _ValueEqual(1000), MockDelayedOperation(1000)]
    for op in ops:
        purgatory.try_complete_else_watch(op, ["k", "j"])
    assert purgatory.watched() == 6, "each op on each key"
    ops[1].completable = True
    assert purgatory.check_and_complete("k") == 1
    assert purgatory.watched() == 4, "finishing unwatched exactly the finished op from both keys"
    for op in (ops[0], ops[2]):
        op.completable = True
    assert purgatory.check_and_complete("j") == 2
    assert purgatory.watched() == 0
    assert [op.completions for op in ops] == [1, 1, 1]


def test_a_watch_racing_a_finish_leaves_no_watcher_behind(purgatory: Purgatory, timer: MockTimer) -> None:
    op = MockDelayedOperation(1000)
    racing = _FinishingKey("b", op)
    # The finish unwatches "a" and finds "b" not yet inserted; the submitter then inserts "b".
    assert purgatory.try_complete_else_watch(op, ["a", racing, "c"]) is False
    assert racing.hashes >= 2, "the finish did not happen inside the watch loop"
    assert op.completions == 1 and op.outcome is Outcome.COMPLETED
    assert purgatory.watched() == 0, "the entry inserted after the finish was taken out again"
    assert timer.size() == 0, "a finished op is not timed"


def test_user_code_may_reenter_the_purgatory_on_the_same_key(purgatory: Purgatory) -> None:
    """KAFKA-3994: no watcher lock is held while user code runs."""
    inner = MockDelayedOperation(1000)
    outer = MockDelayedOperation(1000)
    purgatory.try_complete_else_watch(inner, ["k"])
    purgatory.try_complete_else_watch(outer, ["k"])

    def reenter() -> None:
        outer.on_try = None  # re-enter once: the nested check tries outer again
        inner.completable = True
        purgatory.check_and_complete("k")
        purgatory.try_complete_else_watch(MockDelayedOperation(1000), ["k"])

    outer.on_try = reenter
    outer.completable = True
    with capture_logs() as logs:
        purgatory.check_and_complete("k")
    assert inner.is_completed() and outer.is_completed()
    assert outer.completions == 1 and inner.completions == 1
    assert logs == [], "re-entering is not an error"
    assert purgatory.watched() == 1, "only the op submitted from inside user code is still watched"


class _Rechecking(MockDelayedOperation):
    """Asks for its own key to be checked again from inside ``try_complete``, every time."""

    def __init__(self, purgatory: Purgatory, key: str) -> None:
        super().__init__(1000)
        self.purgatory, self.key = purgatory, key
        self.nested_results: list[int] = []

    def try_complete(self) -> bool:
        self.nested_results.append(self.purgatory.check_and_complete(self.key))
        return super().try_complete()


def test_reentrant_check_on_the_same_key_is_deferred_not_recursed(purgatory: Purgatory) -> None:
    """Issue 15: a try_complete calling check_and_complete on its own key recursed without bound
    (RecursionError after seconds, the key's other ops starved). The nested call now returns 0
    and the outer call re-checks the key once; a re-check that finishes nothing ends it."""
    looping = _Rechecking(purgatory, "k")
    assert purgatory.try_complete_else_watch(looping, ["k"]) is False  # not inside a check: runs
    others = [MockDelayedOperation(1000) for _ in range(3)]
    for op in others:
        purgatory.try_complete_else_watch(op, ["k"])
    others[2].completable = True
    looping.try_calls = 0
    looping.nested_results.clear()
    with capture_logs() as logs:
        assert purgatory.check_and_complete("k") == 1
    assert looping.try_calls == 2, "one pass, and one deferred re-check that finished nothing"
    assert looping.nested_results == [0, 0], "the nested calls were deferred"
    assert others[2].completions == 1, "the key's other ops are still checked"
    assert [op.try_calls for op in others[:2]] == [4, 4], "submit (2 tries), the pass, the one re-check"
    assert logs == [], "deferring is not an error"


class _Unlocking(MockDelayedOperation):
    """When finished, makes ``earlier`` completable and asks for its key to be checked again."""

    def __init__(self, purgatory: Purgatory, earlier: MockDelayedOperation | None) -> None:
        super().__init__(1000)
        self.purgatory, self.earlier = purgatory, earlier
        self.nested_results: list[int] = []

    def on_complete(self) -> None:
        super().on_complete()
        if self.earlier is not None:
            self.earlier.completable = True
            self.nested_results.append(self.purgatory.check_and_complete("k"))


def test_a_deferred_recheck_repeats_while_it_finishes_operations(purgatory: Purgatory) -> None:
    """A finish that makes an earlier op on the same key completable asks for a re-check from
    ``on_complete`` (a produce completing a fetch): the outer call finishes the whole chain,
    one op per pass, and counts them all."""
    chain: list[_Unlocking] = []
    for _ in range(4):
        op = _Unlocking(purgatory, chain[-1] if chain else None)
        purgatory.try_complete_else_watch(op, ["k"])
        chain.append(op)
    chain[-1].completable = True
    assert purgatory.check_and_complete("k") == 4, "the outer call counts every pass"
    assert [op.completions for op in chain] == [1, 1, 1, 1]
    assert [op.nested_results for op in chain] == [[], [0], [0], [0]], "nested calls deferred"
    assert purgatory.watched() == 0


def test_listener_sees_submission_and_finish(purgatory: Purgatory, timer: MockTimer) -> None:
    events: list[tuple[str, str, object]] = []

    class Listener:
        def on_submitted(self, name: str, op: object, keys: object) -> None:
            events.append(("submitted", name, tuple(keys)))  # type: ignore[call-overload]

        def on_finished(self, name: str, op: MockDelayedOperation) -> None:
            events.append(("finished", name, op.outcome))

    purgatory.add_listener(Listener())
    purgatory.try_complete_else_watch(MockDelayedOperation(5), ["a"])
    timer.advance_clock(5)
    assert events == [("submitted", "unit", ("a",)), ("finished", "unit", Outcome.EXPIRED)]


def test_submission_clock_is_read_for_listeners_only(purgatory: Purgatory, timer: MockTimer) -> None:
    """``op.submitted_ns`` (the journal's latency start) lives off the operation until a
    listener needs it: 0 without listeners, the submission's monotonic clock with one, and still
    readable in ``on_finished``."""
    unheard = MockDelayedOperation(1000)
    purgatory.try_complete_else_watch(unheard, ["a"])
    assert unheard.submitted_ns == 0
    seen: list[int] = []

    class Listener:
        def on_submitted(self, name: str, op: MockDelayedOperation, keys: object) -> None:
            seen.append(op.submitted_ns)

        def on_finished(self, name: str, op: MockDelayedOperation) -> None:
            seen.append(op.submitted_ns)

    purgatory.add_listener(Listener())
    before = time.monotonic_ns()
    heard = MockDelayedOperation(5)
    purgatory.try_complete_else_watch(heard, ["a"])
    timer.advance_clock(5)
    assert before <= heard.submitted_ns <= time.monotonic_ns()
    assert seen == [heard.submitted_ns, heard.submitted_ns]
    assert unheard.submitted_ns == 0


def test_listeners_hear_of_operations_released_unfinished(timer: MockTimer) -> None:
    """A refused submission and a cancel_for_key hand-back reach ``on_released`` (the Kafka
    change feed stops polling their keys); a finished op reaches only ``on_finished``."""
    p: Purgatory = DelayedOperationPurgatory("released", timer=timer, reaper_enabled=False, max_pending=1)
    events: list[tuple[str, MockDelayedOperation]] = []

    class Listener:
        def on_submitted(self, name: str, op: MockDelayedOperation, keys: object) -> None:
            events.append(("submitted", op))

        def on_finished(self, name: str, op: MockDelayedOperation) -> None:
            events.append(("finished", op))

        def on_released(self, name: str, op: MockDelayedOperation) -> None:
            events.append(("released", op))

    p.add_listener(Listener())
    kept, refused, failing = (
        MockDelayedOperation(100),
        MockDelayedOperation(100),
        _Failing(100, "try_complete"),
    )
    p.try_complete_else_watch(kept, ["a"])
    with pytest.raises(PurgatoryFullError):
        p.try_complete_else_watch(refused, ["a"])
    with pytest.raises(RuntimeError):
        p.try_complete_else_watch(failing, ["a"])
    assert p.cancel_for_key("a") == [kept]
    assert events == [
        ("submitted", kept),
        ("submitted", refused),
        ("released", refused),
        ("submitted", failing),
        ("released", failing),
        ("released", kept),
    ]
    p.shutdown()
