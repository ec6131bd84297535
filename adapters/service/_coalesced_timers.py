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
``TimerHandle.cancel``); the bucket's timer runs the callbacks of the ones not cancelled.

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

__all__ = ["GRANULARITY_S", "CoalescedTimeout", "CoalescedTimers", "coalesced_timers"]

# How far apart two starts may be to share a timer, and so how late a timeout may fire: far below
# the timeouts it serves (seconds), and a burst of 10,000 answers (~0.1-1 s) needs 10-100 timers.
GRANULARITY_S = 0.010


class CoalescedTimeout:
    """One timeout in a shared bucket: ``cancel()`` as :meth:`asyncio.TimerHandle.cancel`."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        # Dropping the callback also drops the connection it is bound to, as TimerHandle.cancel does.
        self.callback = None

    def cancelled(self) -> bool:
        return self.callback is None


class CoalescedTimers:
    """``call_later(delay_s, callback)`` for one loop and one delay, bucketed (module docstring)."""

    __slots__ = ("__weakref__", "_bucket", "_bucket_start", "_delay_s", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float) -> None:
        self._loop = loop
        self._delay_s = delay_s
        self._bucket: list[CoalescedTimeout] | None = None  # the bucket new timeouts join
        self._bucket_start = 0.0

    def call_later(self, callback: Callable[[], object]) -> CoalescedTimeout:
        """Call ``callback`` after the delay (at most :data:`GRANULARITY_S` late) unless cancelled."""
        now = self._loop.time()
        bucket = self._bucket
        if bucket is None or now - self._bucket_start > GRANULARITY_S:
            bucket = self._bucket = []
            self._bucket_start = now
            self._loop.call_at(now + self._delay_s + GRANULARITY_S, self._fire, bucket)
        timeout = CoalescedTimeout(callback)
        bucket.append(timeout)
        return timeout

    def _fire(self, bucket: list[CoalescedTimeout]) -> None:
        if bucket is self._bucket:
            self._bucket = None  # (only when no timeout started for a whole delay since)
        for timeout in bucket:
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
