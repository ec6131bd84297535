"""OffLoopFetch: a DelayedFetch that never reads records on the event loop's thread.

``purgatory.watch(op, keys)`` makes the operation's first completion attempt on the calling
thread — the event loop's, in the service. A :class:`DelayedFetch` whose records are already
there reads them right then (``try_complete`` with ``min_bytes``, ``_respond`` in any case): a
Kafka round trip of ~10 ms measured, during which no other request of the loop makes progress.

So, on the loop's thread, ``try_complete`` only looks at the facts it already has (no read, no
lock but the op's own): when they say nothing is there past the fetch offsets — the common case
of a long poll at the high watermark — it declines, and the operation simply waits for the next
fact change of its key (the change feed calls ``check_and_complete``). When an attempt could
complete the fetch (records there, an offset out of range, an unknown partition, ``min_records
= 0``) it also declines on the loop, and hands *this operation's* attempt to ``attempts`` (a
small executor of the gateway), where the real attempt — and the read — happens. The cost of a
new waiter is therefore O(1): no executor hop, no re-check of the other operations on its key
(the gateway used to call ``check_and_complete(key)`` per request: O(waiters on the key) each,
O(N²) to register N waiters on one partition — 27.6 s for 5,000).

Anywhere else (the change feed's thread, the executor, the timer's executor on expiry) it
behaves exactly as :class:`DelayedFetch`. A fetch cancelled because its client left reads
nothing: nobody is waiting for the records.

**A key event's equal long polls share one answer.** One record appended to a partition
completes every long poll waiting there at that offset: thousands of operations whose checks,
read and answer are the same. The first one completed in full leaves its answer in
:data:`_last_answer` — the partition's facts object it was decided on, its parameters, the
records read (the shared record cache's list), their size and where the read ended. An attempt
that finds the very same facts object (identity: no fact of the partition changed since) and equal
parameters takes that answer and completes at once: no facts checks, no read, no ``_respond``
(in-process probe: about half of the feed thread's time per completed long poll). Only
one-partition fetches counted by ``min_records`` (``min_bytes`` None) take part: their answer is
one read of ``[fetch offset, high watermark)`` within ``max_bytes``, which equal facts and
parameters make equal — offsets below the high watermark never change — so the answer is the one
the full path would read. Expiry, moves and cancellations take the full path.

Concurrency contract: as :class:`DelayedFetch`. ``loop_thread`` is the ident of the thread
running the event loop that awaits the operation. The hand-off may run before the submission
finished watching the op: it then waits for ``op.lock``, which the submission holds throughout
(Kafka's story about lock), and attempts on a fully watched op.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor
from typing import Any

import structlog

from purgatory import Outcome

from ._fetch import DelayedFetch
from ._results import ErrorCode

__all__ = ["OffLoopFetch"]

_log = structlog.get_logger("purgatory.service")


# The last answer completed in full, for the equal long polls after it (module docstring): (facts
# object, key, fetch offset, max_bytes, min_records, high watermark, records, bytes read, read to).
# One tuple, stored and read in one step (the feed's threads, the timer's executor, the attempts).
_last_answer: tuple[Any, ...] | None = None


class OffLoopFetch(DelayedFetch):
    """:class:`DelayedFetch` deferring every attempt made on ``loop_thread`` (see the module docstring)."""

    # held by the thousands: no instance dict
    __slots__ = ("answered", "attempts", "handed_off", "loop_thread")

    def __init__(self, *args: Any, loop_thread: int, attempts: Executor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop_thread = loop_thread
        self.attempts = attempts
        self.handed_off = False  # at most one hand-off: later attempts come from fact changes
        self.answered = False  # completed with the last answer: its parts hold it already

    def try_complete(self) -> bool:
        if threading.get_ident() == self.loop_thread:
            if not self.handed_off and self.worth_an_attempt():
                self.handed_off = True
                self.attempts.submit(self._attempt)
            return False
        last = _last_answer
        if last is not None and self.min_bytes is None and len(self.parts) == 1:
            part = self.parts[0]
            if (
                last[2] == part.fetch_offset
                and last[3] == self.max_bytes
                and last[4] == self.min_records
                and part.bytes_read == 0
                and part.read_from == part.fetch_offset
                and self.error is None
                and (last[1] is part.key or last[1] == part.key)
                and self.facts.partition(part.key) is last[0]
            ):
                # Under op.lock (safe_try_complete): set before the claim, so whichever finish
                # wins — this one, or an expiry that took the claim first — answers these records.
                part.high_watermark = last[5]
                part.records = last[6]
                part.bytes_read = last[7]
                part.read_from = last[8]
                self.answered = True
                return self.force_complete()
        return super().try_complete()

    def worth_an_attempt(self) -> bool:
        """True unless the known facts say the fetch cannot complete now (nothing to read, all valid).

        False is a promise that :meth:`DelayedFetch.try_complete` would return False and read
        nothing; the next fact change re-checks the op anyway. Unknown facts (a partition not
        polled yet) are such a promise too: their first poll is a change.
        """
        nothing_needed = self.min_records == 0 if self.min_bytes is None else self.min_bytes == 0
        for part in self.parts:
            offset = part.fetch_offset
            facts = self.facts.partition(part.key)
            if facts is None:
                continue
            if facts.error is not None:
                if facts.error.kind == "unknown_topic":
                    return True
                continue
            high, start = facts.high_watermark, facts.log_start_offset
            if high is None:
                continue
            if nothing_needed or offset != high or (start is not None and offset < start):
                return True
        return False

    def _attempt(self) -> None:
        try:
            self.safe_try_complete()
        except Exception:
            # As in check_and_complete: the op stays watched and timed, so it still finishes
            # (next fact change, or expiry); the executor's thread must not die of it.
            _log.exception("fetch_attempt_failed", operation=type(self).__name__)

    def _respond(self) -> None:
        if self.outcome is Outcome.CANCELLED:
            return  # the client left: reading records for nobody would only cost a round trip
        if self.answered:
            return  # the last answer, taken in try_complete: nothing left to read
        super()._respond()
        if self.outcome is Outcome.COMPLETED:
            self._leave_answer()

    def _leave_answer(self) -> None:
        """Leave this completed fetch's answer for the equal long polls after it (module docstring)."""
        global _last_answer
        if self.min_bytes is not None or len(self.parts) != 1 or self.error is not None:
            return
        part = self.parts[0]
        high = part.high_watermark
        if part.status is not ErrorCode.NONE or high is None or self.moved is not None or not part.records:
            return  # nothing read (a stalled partition's read answers [] for a while): no answer to share
        facts = self.facts.partition(part.key)
        # The answer is the read of [fetch offset, high); facts still at that high watermark
        # decide any equal poll the same way (and a later change is a new facts object).
        if facts is None or facts.error is not None or facts.high_watermark != high:
            return
        start = facts.log_start_offset
        if start is not None and part.fetch_offset < start:
            return  # records deleted below it since (DeleteRecords): an equal poll is out of range now
        _last_answer = (
            facts,
            part.key,
            part.fetch_offset,
            self.max_bytes,
            self.min_records,
            high,
            part.records,
            part.bytes_read,
            part.read_from,
        )


# Journals, metrics and the Spark analytics group operations by class name; where an attempt
# runs is an implementation detail of the service: to them this is Kafka's DelayedFetch.
OffLoopFetch.__name__ = OffLoopFetch.__qualname__ = DelayedFetch.__name__
