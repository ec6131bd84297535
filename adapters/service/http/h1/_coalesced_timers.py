"""CoalescedTimers: idle-connection timeouts started in one burst share one event-loop timer.

Why it lives here: the long-poll fast path (:mod:`._long_poll`) answers a burst of thousands of
kept-alive connections in one loop callback, and each answered connection re-arms two timeouts
for its next request (uvicorn's keep-alive timeout, the request-head bound of
:mod:`._head_timeout`). With ``loop.call_later`` that is two :class:`asyncio.TimerHandle` objects
and two pushes on the loop's heap per answer — 20,000 heap entries for 10,000 answers, a seventh
of the loop's Python time in the answer burst (cProfile, ``purgatory bench fanout``). Their
deadlines are seconds away and need no millisecond precision.

How: timeouts of one delay started within :data:`GRANULARITY_S` of each other go into one bucket
with one loop timer, set to fire at the bucket's first start + delay + :data:`GRANULARITY_S` — so
no timeout fires early, and none later than :data:`GRANULARITY_S` after its own deadline. Each
timeout is a small :class:`CoalescedTimeout` whose ``cancel()`` only marks it (O(1), as
``TimerHandle.cancel``); the bucket's timer runs the callbacks of the ones not cancelled. A
bucket drops its cancelled timeouts when they are most of it (:data:`COMPACT_MIN_CANCELLED`).

Worked example (delay 5 s, granularity 10 ms): timeouts started at t = 0.000, 0.004 and 0.009
share bucket A (fires at 5.010); one started at 0.012 opens bucket B (fires at 5.022). The one of
0.004 is cancelled at 1.0 (its client sent a request): at 5.010 bucket A calls the other two.

Concurrency contract: the event loop's thread only, as uvicorn's protocols (``call_later`` and
``cancel`` are called there, and the callbacks run there).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

__all__ = [
    "COMPACT_MIN_CANCELLED",
    "GRANULARITY_S",
    "CoalescedTimeout",
    "CoalescedTimers",
    "coalesced_timers",
]

# How far apart two starts may be to share a timer, and so how late a timeout may fire: far below
# the timeouts it serves (seconds), and a burst of 10,000 answers (~0.1-1 s) needs 10-100 timers.
GRANULARITY_S = 0.010
# A bucket drops its cancelled timeouts once they are more than half of it (and at least this
# many): a churn of connections that each re-arm and cancel within the delay would otherwise keep
# every cancelled timeout of the last delay (seconds: 100,000s of them) alive until its bucket
# fires. Half, so each compaction is paid for by as many cancels since the last: O(1) amortised.
COMPACT_MIN_CANCELLED = 64


class _Bucket:
    """The timeouts started within one granularity window, and how many of them are cancelled.

    ``timeouts`` is None once the bucket fired (a cancel then has nothing to drop).
    """

    __slots__ = ("cancelled", "timeouts")

    def __init__(self) -> None:
        self.timeouts: list[CoalescedTimeout] | None = []
        self.cancelled = 0


class CoalescedTimeout:
    """One timeout in a shared bucket: ``cancel()`` as :meth:`asyncio.TimerHandle.cancel`."""

    __slots__ = ("_bucket", "callback")

    def __init__(self, callback: Callable[[], object], bucket: _Bucket) -> None:
        self.callback: Callable[[], object] | None = callback
        self._bucket = bucket

    def cancel(self) -> None:
        if self.callback is None:
            return  # cancelled, or ran: counted once
        # Dropping the callback also drops the connection it is bound to, as TimerHandle.cancel does.
        self.callback = None
        bucket = self._bucket
        timeouts = bucket.timeouts
        if timeouts is None:
            return  # the bucket fired (this is a cancel from inside a callback of it)
        bucket.cancelled += 1
        if bucket.cancelled >= COMPACT_MIN_CANCELLED and 2 * bucket.cancelled > len(timeouts):
            # In place: the bucket's loop timer holds the bucket, not a copy of the list.
            timeouts[:] = [t for t in timeouts if t.callback is not None]
            bucket.cancelled = 0
            # Pinned by test_a_churn_of_cancelled_timeouts_keeps_only_a_bounded_number_alive.

    def cancelled(self) -> bool:
        return self.callback is None


class CoalescedTimers:
    """``call_later(delay_s, callback)`` for one loop and one delay, bucketed (module docstring)."""

    __slots__ = ("__weakref__", "_bucket", "_bucket_start", "_delay_s", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float) -> None:
        self._loop = loop
        self._delay_s = delay_s
        self._bucket: _Bucket | None = None  # the bucket new timeouts join
        self._bucket_start = 0.0

    def call_later(self, callback: Callable[[], object]) -> CoalescedTimeout:
        """Call ``callback`` after the delay (at most :data:`GRANULARITY_S` late) unless cancelled."""
        now = self._loop.time()
        bucket = self._bucket
        if bucket is None or now - self._bucket_start > GRANULARITY_S:
            bucket = self._bucket = _Bucket()
            self._bucket_start = now
            self._loop.call_at(now + self._delay_s + GRANULARITY_S, self._fire, bucket)
        timeout = CoalescedTimeout(callback, bucket)
        timeouts = bucket.timeouts
        assert timeouts is not None, "the open bucket has not fired: _fire closes it first"
        timeouts.append(timeout)
        return timeout

    def _fire(self, bucket: _Bucket) -> None:
        if bucket is self._bucket:
            self._bucket = None  # (only when no timeout started for a whole delay since)
        timeouts, bucket.timeouts = bucket.timeouts, None  # a cancel from a callback compacts nothing
        for timeout in timeouts or ():
            callback = timeout.callback
            if callback is None:
                continue
            timeout.callback = None  # once: a cancel() from inside a callback is a no-op
            try:
                callback()
            except Exception as exc:
                # As the loop does for a TimerHandle's callback; the rest of the bucket still runs.
                self._loop.call_exception_handler(
                    {"message": "coalesced timeout callback failed", "exception": exc, "callback": callback}
                )


_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, CoalescedTimers]] = (
    weakref.WeakKeyDictionary()
)


def coalesced_timers(loop: asyncio.AbstractEventLoop, delay_s: float) -> CoalescedTimers:
    """The loop's shared :class:`CoalescedTimers` for ``delay_s`` (made on first use, gone with the loop)."""
    per_delay = _timers.get(loop)
    if per_delay is None:
        per_delay = _timers[loop] = {}
    timers = per_delay.get(delay_s)
    if timers is None:
        timers = per_delay[delay_s] = CoalescedTimers(loop, delay_s)
    return timers
