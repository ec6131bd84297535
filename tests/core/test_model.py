"""Model-based test: a hypothesis state machine drives a purgatory on a MockTimer against a model.

The model is deliberately naive — a dict of operations with their deadline, the keys they are
still watched on, whether they are timed and whether their condition holds — and states docs/design.md §3
directly:

* ``try_complete_else_watch`` completes an op whose condition holds on the first or second try
  (True), otherwise watches it on every key and times it (``delay_ms == 0``: it expires at once,
  MockTimer runs non-positive delays on the adding thread).
* ``check_and_complete(key)`` finishes exactly the unfinished ops still watched on ``key`` whose
  condition holds; an op whose ``try_complete`` raises stays watched and timed.
* ``MockTimer.advance_clock(ms)`` expires every timed op due at or before the new time.
* ``cancel_for_key(key)`` returns the unfinished ops watched on ``key``; they are no longer timed,
  still complete through their other keys, and drain leaves them alone — unless the caller
  re-submits one, which makes it the purgatory's again (watched, timed anew, drained).
* finishing unwatches an op from all its keys at once, so ``purge_completed()`` finds nothing
  (single-threaded, no watch can race a finish).
* ``shutdown(drain=True)`` expires every unfinished op not returned by ``cancel_for_key``;
  ``drain=False`` finishes nothing. Afterwards submissions raise ``PurgatoryClosedError``.

Checked after every step: each op finishes at most once with the model's outcome, ``on_expiration``
runs exactly for expired ops, nothing expires before its deadline, nothing due is left after an
advance, and ``num_delayed()`` / ``watched()`` equal the model's counts. Hypothesis shrinks any
divergence to a minimal sequence of steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import structlog
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome, PurgatoryClosedError
from purgatory.testing import MockTimer

KEYS = ("a", "b", "c", ("tp", 0), ("tp", 1), 7)  # any hashable value is a key
DELAYS = st.one_of(st.just(0), st.integers(1, 5), st.integers(1, 60), st.integers(100, 3000))
ADVANCES = st.one_of(st.integers(0, 3), st.integers(1, 70), st.integers(200, 4000))


class ModelOp(DelayedOperation):
    """Completes when ``ready`` (or from its ``ready_on_try``-th try on); raises when ``explodes``.

    Records every callback with the mock time it ran at, so the state machine can check that each
    finishes once, and never before its deadline.
    """

    def __init__(self, op_id: int, delay_ms: int, timer: MockTimer) -> None:
        super().__init__(delay_ms)
        self.op_id = op_id
        self.timer = timer
        self.ready = False
        self.ready_on_try: int | None = None
        self.explodes = False
        self.tries = 0
        self.completions: list[tuple[Outcome | None, int]] = []
        self.expirations = 0

    def try_complete(self) -> bool:
        self.tries += 1
        if self.explodes:
            raise RuntimeError(f"op {self.op_id}: try_complete failed on purpose")
        if self.ready or (self.ready_on_try is not None and self.tries >= self.ready_on_try):
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions.append((self.outcome, self.timer.time.milliseconds()))

    def on_expiration(self) -> None:
        self.expirations += 1


@dataclass
class Expected:
    """The model's view of one submitted operation."""

    op: ModelOp
    deadline: int
    keys: set[object]
    timed: bool = True
    keys_cancelled: bool = False
    ready: bool = False
    explodes: bool = False
    outcome: Outcome | None = None
    drained: bool = False  # expired by shutdown's drain, not by the timer (may be before the deadline)


@dataclass
class Model:
    now: int = 0
    ops: dict[int, Expected] = field(default_factory=dict)
    closed: bool = False
    user_code_errors: int = 0

    def pending(self) -> list[Expected]:
        return [e for e in self.ops.values() if e.outcome is None]

    def finish(self, e: Expected, outcome: Outcome) -> None:
        assert e.outcome is None
        e.outcome, e.keys, e.timed = outcome, set(), False


class PurgatoryMachine(RuleBasedStateMachine):
    ops = Bundle("ops")

    def __init__(self) -> None:
        super().__init__()
        self.timer = MockTimer()
        self.purgatory: DelayedOperationPurgatory[ModelOp] = DelayedOperationPurgatory(
            "model", timer=self.timer, reaper_enabled=False
        )
        self.model = Model()
        self.next_id = 0

    # -- submissions ---------------------------------------------------------------------------

    @initialize()
    def start_clean(self) -> None:
        assert self.purgatory.watched() == 0 and self.purgatory.num_delayed() == 0

    @precondition(lambda self: not self.model.closed)
    @rule(
        target=ops,
        delay=DELAYS,
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
        how=st.sampled_from(["waits", "waits", "waits", "ready", "ready_on_second_try"]),
    )
    def submit(self, delay: int, keys: list[object], how: str) -> ModelOp:
        op = ModelOp(self.next_id, delay, self.timer)
        self.next_id += 1
        if how == "ready":
            op.ready = True
        elif how == "ready_on_second_try":
            op.ready_on_try = 2  # the condition turns true between the first try and the watch
        e = Expected(op, deadline=self.model.now + delay, keys=set(keys), ready=op.ready)
        self.model.ops[op.op_id] = e
        completed = self.purgatory.try_complete_else_watch(op, keys)
        if how != "waits":
            assert completed, f"{how} op must be completed by the submitting call"
            self.model.finish(e, Outcome.COMPLETED)
            e.ready = True
        else:
            assert not completed, "an op whose condition does not hold must not complete"
            if delay == 0:
                self.model.finish(e, Outcome.EXPIRED)  # MockTimer runs 0-delay tasks at once
        return op

    @precondition(lambda self: self.model.closed)
    @rule(delay=DELAYS, key=st.sampled_from(KEYS))
    def submit_after_shutdown_is_refused(self, delay: int, key: object) -> None:
        op = ModelOp(-1, delay, self.timer)
        with pytest.raises(PurgatoryClosedError):
            self.purgatory.try_complete_else_watch(op, [key])
        assert op.completions == [] and not op.is_completed()

    @precondition(lambda self: not self.model.closed)
    @rule(delay=DELAYS, key=st.sampled_from(KEYS))
    def submit_raising_is_neither_watched_nor_timed(self, delay: int, key: object) -> None:
        op = ModelOp(-1, delay, self.timer)
        op.explodes = True
        with pytest.raises(RuntimeError, match="on purpose"):
            self.purgatory.try_complete_else_watch(op, [key])
        assert op.completions == [] and not op.is_completed()

    # -- conditions and key events -------------------------------------------------------------

    @rule(op=ops)
    def condition_becomes_true(self, op: ModelOp) -> None:
        op.ready = True
        self.model.ops[op.op_id].ready = True

    @rule(op=ops, explodes=st.booleans())
    def try_complete_starts_or_stops_raising(self, op: ModelOp, explodes: bool) -> None:
        op.explodes = explodes
        self.model.ops[op.op_id].explodes = explodes

    @rule(key=st.sampled_from(KEYS))
    def key_event(self, key: object) -> None:
        on_key = [e for e in self.model.pending() if key in e.keys]
        expected = [e for e in on_key if e.ready and not e.explodes]
        with structlog.testing.capture_logs() as logs:
            finished = self.purgatory.check_and_complete(key)
        assert finished == len(expected), (
            f"check_and_complete({key!r}) finished {finished}, model expected {len(expected)}"
        )
        for e in expected:
            self.model.finish(e, Outcome.COMPLETED)
        failures = [e for e in on_key if e.explodes]
        self.model.user_code_errors += len(failures)
        logged = [log for log in logs if log["event"] == "user_callback_failed"]
        assert len(logged) == len(failures), "every try_complete failure is logged"

    @rule(op=ops)
    def force_complete(self, op: ModelOp) -> None:
        e = self.model.ops[op.op_id]
        won = op.force_complete()
        assert won == (e.outcome is None), "force_complete wins iff the op was unfinished"
        if won:
            self.model.finish(e, Outcome.COMPLETED)

    @rule(key=st.sampled_from(KEYS))
    def cancel_for_key(self, key: object) -> None:
        expected = {e.op.op_id for e in self.model.pending() if key in e.keys}
        returned = self.purgatory.cancel_for_key(key)
        assert sorted(op.op_id for op in returned) == sorted(expected), (
            f"cancel_for_key({key!r}) returned the wrong operations"
        )
        for op_id in expected:
            e = self.model.ops[op_id]
            e.keys.discard(key)
            e.timed = False
            e.keys_cancelled = True
        assert all(not op.is_completed() for op in returned), "cancel_for_key finishes nothing"

    @precondition(lambda self: not self.model.closed)
    @rule(op=ops, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
    def resubmit_after_cancel_for_key(self, op: ModelOp, keys: list[object]) -> None:
        """The caller gives an op returned by cancel_for_key back (moved to new keys)."""
        e = self.model.ops[op.op_id]
        assume(e.keys_cancelled and e.outcome is None and not e.explodes)
        completed = self.purgatory.try_complete_else_watch(op, keys)
        e.keys_cancelled = False  # the purgatory's again: drain must finish it
        if e.ready:
            assert completed, "a ready op completes on its first try"
            self.model.finish(e, Outcome.COMPLETED)
            return
        assert not completed
        e.keys |= set(keys)
        e.timed = True
        e.deadline = self.model.now + op.delay_ms
        if op.delay_ms == 0:
            self.model.finish(e, Outcome.EXPIRED)

    # -- time ----------------------------------------------------------------------------------

    @rule(ms=ADVANCES)
    def advance_clock(self, ms: int) -> None:
        self.model.now += ms
        due = sorted(
            (e for e in self.model.pending() if e.timed and e.deadline <= self.model.now),
            key=lambda e: e.deadline,
        )
        self.timer.advance_clock(ms)
        for e in due:
            self.model.finish(e, Outcome.EXPIRED)

    @rule()
    def purge_completed(self) -> None:
        assert self.purgatory.purge_completed() == 0, (
            "finished ops leave every watch list at once: a purge finds nothing"
        )

    # -- shutdown ------------------------------------------------------------------------------

    @precondition(lambda self: not self.model.closed)
    @rule(drain=st.booleans())
    def shutdown(self, drain: bool) -> None:
        self.do_shutdown(drain)

    def do_shutdown(self, drain: bool) -> None:
        if drain:
            for e in self.model.pending():
                if not e.keys_cancelled:
                    self.model.finish(e, Outcome.EXPIRED)
                    e.drained = True
        self.model.closed = True
        self.purgatory.shutdown(drain=drain)
        # After shutdown nothing changes any more except by the caller (force_complete).

    def teardown(self) -> None:
        if not self.model.closed:
            self.do_shutdown(drain=True)
            self.check_every_operation()
            left = [e.op.op_id for e in self.model.pending() if not e.keys_cancelled]
            assert not left, f"drain left operations unfinished: {left}"

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def check_every_operation(self) -> None:
        for e in self.model.ops.values():
            op = e.op
            assert len(op.completions) <= 1, f"op {op.op_id} finished {len(op.completions)} times"
            assert op.outcome is e.outcome, f"op {op.op_id}: outcome {op.outcome}, model {e.outcome}"
            if e.outcome is None:
                assert op.completions == [] and op.expirations == 0 and not op.is_completed()
                if e.timed and not self.model.closed:
                    assert e.deadline > self.model.now, (
                        f"op {op.op_id} was due at {e.deadline} and is still pending at {self.model.now}"
                    )
                continue
            assert len(op.completions) == 1, f"op {op.op_id} finished but on_complete did not run once"
            outcome, at = op.completions[0]
            assert outcome is e.outcome, "op.outcome is set before on_complete runs"
            assert op.expirations == (1 if e.outcome is Outcome.EXPIRED else 0), (
                f"op {op.op_id}: on_expiration ran {op.expirations} times for outcome {e.outcome}"
            )
            if e.outcome is Outcome.EXPIRED and not e.drained:
                assert at >= e.deadline, f"op {op.op_id} expired at {at}, before its deadline {e.deadline}"

    @invariant()
    def sizes_match_the_model(self) -> None:
        if self.model.closed:
            return
        pending = self.model.pending()
        timed = sum(1 for e in pending if e.timed)
        assert self.purgatory.num_delayed() == timed, (
            f"num_delayed()={self.purgatory.num_delayed()}, model has {timed} timed ops"
        )
        watched = sum(len(e.keys) for e in pending)
        assert self.purgatory.watched() == watched, (
            f"watched()={self.purgatory.watched()}, model has {watched} watch entries"
        )
        assert self.purgatory.stats.as_dict()["user_code_errors"] == self.model.user_code_errors


PurgatoryMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_purgatory_matches_the_model = PurgatoryMachine.TestCase
