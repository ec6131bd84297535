"""CoalescedTimers: timeouts of one burst share one loop timer; none fires early, cancelled ones never.

The loop is a fake of the one method pair the class uses (``time``, ``call_at``), so the test
moves time itself and runs the loop timers it chooses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from purgatory.adapters.service._coalesced_timers import GRANULARITY_S, CoalescedTimers

DELAY_S = 5.0


class _FakeLoop:
    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[..., object], tuple[Any, ...]]] = []
        self.errors: list[dict[str, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> None:
        self.timers.append((when, callback, args))

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def run_due(self, until: float) -> None:
        """Move time to ``until`` and run the loop timers due by then, in deadline order."""
        self.now = until
        due = sorted((t for t in self.timers if t[0] <= until), key=lambda t: t[0])
        self.timers = [t for t in self.timers if t[0] > until]
        for _, callback, args in due:
            callback(*args)


def _timers(loop: _FakeLoop) -> CoalescedTimers:
    return CoalescedTimers(cast(asyncio.AbstractEventLoop, loop), DELAY_S)


def test_timeouts_started_within_the_granularity_share_one_loop_timer_and_none_fires_early() -> None:
    loop = _FakeLoop()
    timers = _timers(loop)
    fired: list[str] = []
    start = loop.now
    timers.call_later(lambda: fired.append("a"))
    loop.now = start + GRANULARITY_S / 2
    timers.call_later(lambda: fired.append("b"))
    loop.now = start + GRANULARITY_S * 1.5  # past the first bucket's window: a bucket of its own
    timers.call_later(lambda: fired.append("c"))
    assert len(loop.timers) == 2, "two buckets, two loop timers, for three timeouts"
    loop.run_due(start + DELAY_S + GRANULARITY_S / 2)
    assert fired == [], "nothing fires before its bucket time, which is past each member deadline"
    loop.run_due(start + DELAY_S + GRANULARITY_S)
    assert fired == ["a", "b"], "the first bucket fires at its first start + delay + granularity"
    loop.run_due(start + DELAY_S + 2.5 * GRANULARITY_S)
    assert fired == ["a", "b", "c"], "at most one granularity after c's own deadline"


def test_a_cancelled_timeout_never_runs_and_the_others_of_its_bucket_do() -> None:
    loop = _FakeLoop()
    timers = _timers(loop)
    fired: list[str] = []
    kept = timers.call_later(lambda: fired.append("kept"))
    dropped = timers.call_later(lambda: fired.append("dropped"))
    dropped.cancel()
    assert dropped.cancelled() and not kept.cancelled()
    loop.run_due(loop.now + DELAY_S + GRANULARITY_S)
    assert fired == ["kept"]
    kept.cancel()  # after it ran: a no-op, as TimerHandle.cancel
    assert fired == ["kept"]


def test_a_failing_callback_is_reported_and_the_rest_of_the_bucket_still_runs() -> None:
    loop = _FakeLoop()
    timers = _timers(loop)
    fired: list[str] = []

    def fail() -> None:
        raise ValueError("boom")

    timers.call_later(fail)
    timers.call_later(lambda: fired.append("after"))
    loop.run_due(loop.now + DELAY_S + GRANULARITY_S)
    assert fired == ["after"], "one failure does not strand the others"
    assert len(loop.errors) == 1 and isinstance(loop.errors[0]["exception"], ValueError)


def test_a_new_burst_after_a_bucket_fired_gets_a_timer_of_its_own() -> None:
    loop = _FakeLoop()
    timers = _timers(loop)
    fired: list[int] = []
    timers.call_later(lambda: fired.append(1))
    loop.run_due(loop.now + DELAY_S + GRANULARITY_S)
    timers.call_later(lambda: fired.append(2))
    assert len(loop.timers) == 1, "the fired bucket is not joined again"
    loop.run_due(loop.now + DELAY_S + GRANULARITY_S)
    assert fired == [1, 2]
