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

**A key event's equal long polls share one operation**, not one answer per operation: the
service groups equal long polls on one OffLoopFetch (``adapters/service/app/_poll_groups.py``),
and keeps that operation's rendered answer in its ``shared_answer`` slot (the service's
``answers/_shared.py``: this room does not know what is put there; the operation's lifetime
bounds it).

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

__all__ = ["OffLoopFetch"]

_log = structlog.get_logger("purgatory.service")


class OffLoopFetch(DelayedFetch):
    """:class:`DelayedFetch` deferring every attempt made on ``loop_thread`` (see the module docstring)."""

    # held by the thousands: no instance dict
    __slots__ = ("attempts", "handed_off", "loop_thread", "shared_answer")

    def __init__(self, *args: Any, loop_thread: int, attempts: Executor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop_thread = loop_thread
        self.attempts = attempts
        self.handed_off = False  # at most one hand-off: later attempts come from fact changes
        self.shared_answer: object = None  # what its user keeps of its answer (module docstring)

    def try_complete(self) -> bool:
        if threading.get_ident() == self.loop_thread:
            if not self.handed_off and self.worth_an_attempt():
                self.handed_off = True
                self.attempts.submit(self._attempt)
            return False
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
        super()._respond()


# Journals, metrics and the Spark analytics group operations by class name; where an attempt
# runs is an implementation detail of the service: to them this is Kafka's DelayedFetch.
OffLoopFetch.__name__ = OffLoopFetch.__qualname__ = DelayedFetch.__name__
