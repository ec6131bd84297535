"""LoopHandoff: outcomes finished on other threads reach an event loop in batches, one wake-up each.

``purgatory.watch`` awaits a future of the caller's loop; the operation usually finishes on
another thread (the change feed's, the timer's executor). Handing each outcome over with its
own ``loop.call_soon_threadsafe`` costs a write to the loop's self-pipe and a loop iteration per
operation: a key event completing 10,000 long polls made 10,000 wake-ups, and the first answer
waited behind the hand-off of the rest (``purgatory bench fanout``). Here the finishing thread
appends ``(future, outcome)`` to the loop's mailbox and schedules one drain only when none is
pending; the drain resolves every future queued so far in one callback.

Worked example: the feed thread completes ops A, B, C on one key. A's post finds no drain
scheduled and schedules one; B's and C's only append. The loop runs the drain once and sets
A's, B's and C's futures; their awaiting tasks run in the next iteration.

**Bursts** (:func:`handoff_burst`). The "one wake-up per burst" above holds only while the loop
is not running: with the loop idle on another core, its self-pipe write releases the GIL, the
loop wakes, drains the two or three outcomes posted so far and sleeps again, and the next post
finds the flag cleared and writes again. A key event completing 10,000 long polls made ~3,400
wake-ups that way (a ``send`` each on the finishing thread, a loop iteration and, over HTTP/2,
a write per connection each on the loop). A thread that knows it is finishing many operations
at once (the change feed waking a key) wraps the burst in ``with handoff_burst():``: its posts
only append, and the loops they went to are woken every :data:`BURST_CHUNK` posts and when the
burst ends — a few dozen wake-ups for 10,000 outcomes, the first of them after ``BURST_CHUNK``
finishes rather than after all. A call that may block inside a burst (a Kafka read) first wakes
the loops for what the burst holds (:func:`release_burst`): no answer waits for another's read.

**A drain takes what was there when it started.** The finishing thread keeps posting while the
loop drains (they share the GIL in 5 ms slices), so a drain that ran until the mailbox was empty
followed the whole burst: the answers' writes, which their callbacks schedule with
``call_soon`` for after the drain, waited for the last of 10,000 finishes, and the first answer
went out with the last (``purgatory bench fanout``: first answer 118-174 ms in some runs, 13-45
in others, as the drain did or did not catch up with the feed thread early). A drain therefore
handles the entries present when it starts; what is posted meanwhile was posted after the flag
was cleared, so its own drain is scheduled (by the post, or by its burst's chunk or end) and runs
after the writes already scheduled.

Concurrency contract: ``post`` may be called from any thread, ``_drain`` runs on the loop.
The race it must survive — a post landing while a drain runs — is closed by the order of the
two steps: ``_drain`` clears ``_scheduled`` *before* it pops, and ``post`` appends *before* it
reads ``_scheduled``. A post whose append the running drain misses therefore sees the flag
cleared and schedules another drain; at worst a drain finds nothing (deque appends and pops are
atomic under the GIL). Two posters racing on a cleared flag both schedule: an extra, empty drain.
A burst keeps that order: every post it holds back is followed, at the latest when the burst ends
(in a ``finally``), by its mailbox's ``_schedule`` — an append, then a read of the flag.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["BURST_CHUNK", "LoopHandoff", "draining_loop", "handoff_burst", "handoff_for", "release_burst"]

_log = structlog.get_logger("purgatory")

# Posts a burst holds back before it wakes their loops anyway: the loop starts answering (and
# the client reading) after a few hundred finishes, not after all 10,000, while the wake-ups
# stay ~40 per 10,000 (each costs the poster a self-pipe write, the loop an iteration).
BURST_CHUNK = 256


class _Burst:
    """This thread's open burst: the mailboxes it posted to and has not woken yet."""

    __slots__ = ("depth", "held", "mailboxes")

    def __init__(self) -> None:
        self.depth = 0  # nested bursts (a key event inside another's callback) end with the outer
        self.held = 0
        self.mailboxes: list[LoopHandoff] = []

    def hold(self, mailbox: LoopHandoff) -> None:
        if mailbox not in self.mailboxes:  # a list: one or two loops per process, not thousands
            self.mailboxes.append(mailbox)
        self.held += 1
        if self.held >= BURST_CHUNK:
            self.release()

    def release(self) -> None:
        mailboxes, self.mailboxes, self.held = self.mailboxes, [], 0
        for mailbox in mailboxes:
            mailbox._schedule()

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.release()


_bursts = threading.local()


def handoff_burst() -> _Burst:
    """``with handoff_burst():`` — this thread's posts wake their loops in chunks (module docstring)."""
    burst: _Burst | None = getattr(_bursts, "burst", None)
    if burst is None:
        burst = _bursts.burst = _Burst()
    return burst


def release_burst() -> None:
    """Wake now the loops this thread's open burst holds posts for (none open: nothing to do).

    For a call that may block inside a burst — a Kafka read of a key event's operation: the
    finishes before it must not wait for it (tests/kafka/test_bulk_completion.py).
    """
    burst = _open_burst()
    if burst is not None and burst.held:
        burst.release()


def _open_burst() -> _Burst | None:
    burst: _Burst | None = getattr(_bursts, "burst", None)
    return burst if burst is not None and burst.depth else None


class LoopHandoff:
    """One event loop's mailbox of finished outcomes (see the module docstring)."""

    __slots__ = ("__weakref__", "_calls", "_loop", "_queue", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the module's table maps the loop to this mailbox, so a strong reference here
        # would keep every loop that ever awaited an operation alive.
        self._loop = weakref.ref(loop)
        self._queue: deque[tuple[asyncio.Future[Any], Any]] = deque()
        # Callbacks of waiters that are not futures (the service's protocol-level long polls:
        # no task awaits them, the callback writes the answer itself).
        self._calls: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._scheduled = False

    def post(self, future: asyncio.Future[Any], result: Any) -> None:
        """Set ``future``'s result on its loop soon (from any thread); a done future is left alone."""
        self._queue.append((future, result))  # first append, then read the flag (module docstring)
        burst = _open_burst()
        if burst is None:
            self._schedule()
        else:
            burst.hold(self)

    def post_call(self, callback: Callable[[Any], None], argument: Any) -> None:
        """Call ``callback(argument)`` on the loop soon (from any thread), in the same batches."""
        self._calls.append((callback, argument))  # first append, then read the flag
        burst = _open_burst()
        if burst is None:
            self._schedule()
        else:
            burst.hold(self)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            loop = self._loop()
            try:
                if loop is None:
                    raise RuntimeError("the loop is gone")
                loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed or gone: nobody awaits its futures any more
                self._scheduled = False

    def _drain(self) -> None:
        self._scheduled = False  # first clear the flag, then pop (module docstring)
        # The callbacks below run on this loop: say so to waiters finished by them (draining_loop).
        _draining.loop = self._loop()
        try:
            self._drain_now()
        finally:
            _draining.loop = None

    def _drain_now(self) -> None:
        # Only what is here now: what is posted meanwhile has a drain of its own coming
        # (module docstring, "A drain takes what was there when it started").
        queue = self._queue
        for _ in range(len(queue)):
            future, result = queue.popleft()
            if not future.done():  # cancelled meanwhile (the waiting task gave up)
                future.set_result(result)
        calls = self._calls
        for _ in range(len(calls)):
            callback, argument = calls.popleft()
            try:
                callback(argument)
            except Exception:
                # One failing waiter must not strand the rest of the batch in the mailbox.
                name = getattr(callback, "__qualname__", "?")
                _log.exception("loop_handoff_callback_failed", callback=name)


# The loop whose mailbox this thread is draining now (None: none): per thread, so a finish on
# another thread while a loop drains is never taken for a finish on that loop.
_draining = threading.local()


def draining_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop whose hand-off drain is running on this thread, or None."""
    loop: asyncio.AbstractEventLoop | None = getattr(_draining, "loop", None)
    return loop


_handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopHandoff] = weakref.WeakKeyDictionary()
_handoffs_lock = threading.Lock()


def handoff_for(loop: asyncio.AbstractEventLoop) -> LoopHandoff:
    """The mailbox of ``loop`` (one per loop, created on first use, gone with the loop)."""
    handoff = _handoffs.get(loop)
    if handoff is None:
        with _handoffs_lock:  # two first watchers on one loop must share one mailbox
            handoff = _handoffs.get(loop)
            if handoff is None:
                handoff = _handoffs[loop] = LoopHandoff(loop)
    return handoff
