"""CoalescedTimers: timeouts of one burst share one loop timer; none fires early, cancelled ones never.

The loop is a fake of the one method pair the class uses (``time``, ``call_at``), so the test
moves time itself and runs the loop timers it chooses.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any, cast

from purgatory.adapters.service.http.h1._coalesced_timers import (
    COMPACT_MIN_CANCELLED,
    GRANULARITY_S,
    CoalescedTimeout,
    CoalescedTimers,
)

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


def _alive_timeouts() -> int:
    gc.collect()  # what is still reachable, not what a cycle keeps until the collector runs
    return sum(type(o) is CoalescedTimeout for o in gc.get_objects())


CHURN = 100_000


def test_a_churn_of_cancelled_timeouts_keeps_only_a_bounded_number_alive() -> None:
    """Keep-alive connections re-arm and cancel within one delay: 100,000 cancelled timeouts in one
    bucket must not stay alive until the bucket fires; every live one still fires, once."""
    loop = _FakeLoop()
    timers = _timers(loop)
    fired: list[int] = []
    before = _alive_timeouts()
    kept = []
    for i in range(CHURN):
        timeout = timers.call_later(lambda i=i: fired.append(i))  # type: ignore[misc]
        if i % 1000 == 0:
            kept.append(timeout)
        else:
            timeout.cancel()
        del timeout
    alive = _alive_timeouts() - before
    assert alive <= 2 * len(kept) + COMPACT_MIN_CANCELLED, (
        f"{alive} timeouts alive after {CHURN} cancelled and {len(kept)} kept"
    )
    loop.run_due(loop.now + DELAY_S + GRANULARITY_S)
    assert fired == list(range(0, CHURN, 1000)), "the kept ones fire, once, in start order"


def test_cancelling_another_timeout_of_the_firing_bucket_from_a_callback_skips_it() -> None:
    loop = _FakeLoop()
    timers = _timers(loop)
    fired: list[str] = []
    later: list[CoalescedTimeout] = []
    timers.call_later(lambda: (fired.append("first"), [t.cancel() for t in later]))
    later.extend(timers.call_later(lambda: fired.append("later")) for _ in range(2 * COMPACT_MIN_CANCELLED))
    timers.call_later(lambda: fired.append("last"))
    loop.run_due(loop.now + DELAY_S + GRANULARITY_S)
    assert fired == ["first", "last"], "cancelled from inside the bucket: never run, the rest still runs"
