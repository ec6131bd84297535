"""Fault scenarios: what breaks, what must keep working, and how each affected operation ended.

A scenario returns a :class:`FaultResult`: whether the purgatory survived (kept serving, every
affected operation finished exactly once with a clear status, no purgatory thread died) and the
figures behind that verdict. :func:`callback_faults` needs nothing but the core; the Kafka
scenarios live in :mod:`.kafka_faults` (the ``kafka`` extra).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import structlog
import structlog.testing

from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome

__all__ = ["FaultResult", "callback_faults"]

FINISH_TIMEOUT_S = 10.0  # bound on waiting for the faulty operations to finish
SERVE_BUDGET_S = 1.0  # a healthy operation submitted after the faults must finish within this
FAULTY_OPS_PER_KIND = 50  # enough to catch a thread dying on the n-th failure, cheap to run
SHORT_DELAY_MS = 30  # faulty ops that must expire do so quickly


@dataclass
class FaultResult:
    """One fault scenario's verdict and figures."""

    name: str
    affected: int = 0  # operations the fault touched
    outcomes: dict[str, int] = field(default_factory=dict)  # how the affected ones ended
    user_code_errors: int = 0
    logged_errors: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def survived(self) -> bool:
        return not self.problems

    def check(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "survived": self.survived,
            "affected": self.affected,
            "outcomes": dict(self.outcomes),
            "user_code_errors": self.user_code_errors,
            "logged_errors": self.logged_errors,
            "seconds": round(self.seconds, 3),
            "problems": list(self.problems),
        }


class FaultInjected(RuntimeError):
    """The exception user callbacks raise on purpose in these scenarios."""


class _Faulty(DelayedOperation):
    """Raises ``FaultInjected`` from the callback named by ``fault`` (or none); records finishes."""

    def __init__(self, delay_ms: int, fault: str, done: Callable[[_Faulty], None]) -> None:
        super().__init__(delay_ms)
        self.fault = fault
        self.ready = False
        self.completions = 0
        self.expirations = 0
        self._done = done

    def try_complete(self) -> bool:
        if self.fault == "try_complete":
            raise FaultInjected("try_complete")
        return self.force_complete() if self.ready else False

    def on_complete(self) -> None:
        self.completions += 1
        self._done(self)
        if self.fault == "on_complete":
            raise FaultInjected("on_complete")

    def on_expiration(self) -> None:
        self.expirations += 1
        if self.fault == "on_expiration":
            raise FaultInjected("on_expiration")


class _FaultyListener:
    """A purgatory listener that raises on every ``on_finished`` (a broken journal, say)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_submitted(self, purgatory: str, op: DelayedOperation, keys: Sequence[Hashable]) -> None:
        pass

    def on_finished(self, purgatory: str, op: DelayedOperation) -> None:
        self.calls += 1
        raise FaultInjected("listener.on_finished")


class _Finishes:
    """A healthy listener that signals once ``expected`` operations finished.

    Why a listener and not ``on_complete``: listeners hear of a finish after every callback ran
    and its failure was counted (``operation_finished`` comes last), so the stats read after this
    signal hold every user-code error. Signalled from ``on_complete``, the last ``on_expiration``
    failure could still be uncounted when the stats were read (149 of 150, on a loaded machine).
    """

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.all_done = threading.Event()
        self._finished = 0
        self._lock = threading.Lock()

    def on_submitted(self, purgatory: str, op: DelayedOperation, keys: Sequence[Hashable]) -> None:
        pass

    def on_finished(self, purgatory: str, op: DelayedOperation) -> None:
        with self._lock:
            self._finished += 1
            if self._finished >= self.expected:
                self.all_done.set()


def callback_faults() -> FaultResult:
    """Every user callback raises, many times, on a real purgatory (SystemTimer, reaper).

    Kinds: ``try_complete`` raising at submission (must propagate to the caller, nothing watched),
    ``try_complete`` raising on key events (logged and counted, the op stays watched and timed,
    the other ops on the key are still checked, then it expires), ``on_complete`` raising (still
    finished), ``on_expiration`` raising (still finished as expired), and a listener raising on
    every finish. Afterwards a healthy operation must still complete at once.
    """
    # Captured, not rendered: every failure is logged with its traceback, and the scenario checks
    # the log events instead of printing hundreds of tracebacks.
    with structlog.testing.capture_logs() as logs:
        result = _callback_faults()
    failures = [log for log in logs if log["event"] in ("user_callback_failed", "listener_failed")]
    result.check(
        len(failures) >= result.user_code_errors,
        f"{len(failures)} failures logged for {result.user_code_errors} counted",
    )
    result.logged_errors = len(failures)
    return result


def _callback_faults() -> FaultResult:
    result = FaultResult("exceptions from every user callback")
    started = time.perf_counter()
    purgatory: DelayedOperationPurgatory[_Faulty] = DelayedOperationPurgatory("faults", purge_interval=10)
    listener = _FaultyListener()
    purgatory.add_listener(listener)
    expected = FAULTY_OPS_PER_KIND * 3 * 2  # three kinds, each a faulty op and a healthy neighbour
    finishes = _Finishes(expected)
    purgatory.add_listener(finishes)
    finished: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()

    def done(op: _Faulty) -> None:
        with lock:
            finished[id(op)] += 1

    ops: list[_Faulty] = []
    refused = 0
    try:
        for i in range(FAULTY_OPS_PER_KIND):
            submit_raises = _Faulty(60_000, "try_complete", done)
            try:
                purgatory.try_complete_else_watch(submit_raises, [f"submit-{i}"])
            except FaultInjected:
                refused += 1
            # The remaining kinds, with a healthy op sharing each key that must still complete.
            for kind in ("try_complete_on_event", "on_complete", "on_expiration"):
                fault = "try_complete" if kind == "try_complete_on_event" else kind
                key = f"{kind}-{i}"
                delay = SHORT_DELAY_MS if kind != "on_complete" else 60_000
                op = _Faulty(delay, "none", done)
                purgatory.try_complete_else_watch(op, [key])
                op.fault = fault  # fail from now on (the submission itself went through)
                healthy = _Faulty(60_000, "none", done)
                purgatory.try_complete_else_watch(healthy, [key])
                ops.extend((op, healthy))
                if kind == "on_complete":
                    op.ready = True
                healthy.ready = True
                purgatory.check_and_complete(key)
        result.check(finishes.all_done.wait(FINISH_TIMEOUT_S), "some operations never finished")
        result.check(
            refused == FAULTY_OPS_PER_KIND,
            f"{refused} of {FAULTY_OPS_PER_KIND} raising submissions propagated",
        )
        purgatory.purge_completed()
        result.check(purgatory.watched() == 0, f"{purgatory.watched()} watcher entries left")
        result.check(purgatory.num_delayed() == 0, f"{purgatory.num_delayed()} operations still timed")
        result.check(all(n == 1 for n in finished.values()), "an operation finished more than once")
        for op in ops:
            expect = Outcome.EXPIRED if op.fault in ("try_complete", "on_expiration") else Outcome.COMPLETED
            if op.outcome is not expect:
                result.problems.append(f"a {op.fault} op ended {op.outcome}, expected {expect}")
                break
            if op.expirations != (1 if expect is Outcome.EXPIRED else 0):
                result.problems.append(f"a {op.fault} op ran on_expiration {op.expirations} times")
                break
        # Still serving: a healthy operation completes at once, on a fresh key and on an old one.
        for key in ("after-the-faults", "on_complete-0"):
            probe = _Faulty(60_000, "none", lambda _op: None)
            purgatory.try_complete_else_watch(probe, [key])
            probe.ready = True
            began = time.perf_counter()
            purgatory.check_and_complete(key)
            result.check(
                probe.outcome is Outcome.COMPLETED and time.perf_counter() - began < SERVE_BUDGET_S,
                f"the purgatory stopped serving key {key!r}",
            )
        reaper = purgatory._reaper
        result.check(reaper is not None and reaper.is_alive(), "the reaper thread died")
        stats = purgatory.stats.as_dict()
        result.user_code_errors = stats["user_code_errors"]
        # try_complete on events: at least one failed try each; on_complete, on_expiration: one
        # each (the listener's failures are logged, not counted as user-code errors).
        result.check(
            result.user_code_errors >= 3 * FAULTY_OPS_PER_KIND,
            f"{result.user_code_errors} user-code errors counted, expected >= {3 * FAULTY_OPS_PER_KIND}",
        )
        result.check(listener.calls == len(ops) + 2, f"the failing listener heard {listener.calls} finishes")
    finally:
        purgatory.shutdown()
    result.affected = len(ops) + refused
    outcome_counts = collections.Counter(op.outcome.value if op.outcome else "pending" for op in ops)
    outcome_counts["refused (raised to the caller)"] = refused
    result.outcomes = dict(outcome_counts)
    result.seconds = time.perf_counter() - started
    return result
