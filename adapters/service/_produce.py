"""OffLoopProduce: a DelayedProduce that never reads its record back on the event loop's thread.

A :class:`DelayedProduce` from :class:`FencedAppender` answers ``NONE`` only after reading the
record at its appended offset back (see there: a deposed leader's append). Its first completion
attempt runs on the calling thread — the event loop's, in the service — and when the high
watermark has already passed the offset (a quick replication) that read would happen right then:
a Kafka round trip when the shared record cache misses, during which no other request of the
loop makes progress. So, as :class:`OffLoopFetch` does for records, an attempt on the loop's
thread that needs a read declines and hands *this operation's* attempt to ``attempts`` (the
gateway's small executor), where the real attempt — and the read — happens. Anywhere else (the
change feed's thread, the executor) it behaves exactly as :class:`DelayedProduce`.

Concurrency contract: as :class:`DelayedProduce`; the hand-off as in :class:`OffLoopFetch`.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor
from typing import Any

import structlog

from ..kafka import DelayedProduce, ErrorCode, TopicPartitionKey

__all__ = ["OffLoopProduce"]

_log = structlog.get_logger("purgatory.service")


class OffLoopProduce(DelayedProduce):
    """:class:`DelayedProduce` reading its records back off ``loop_thread`` (see the module docstring)."""

    def __init__(self, *args: Any, loop_thread: int, attempts: Executor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop_thread = loop_thread
        self.attempts = attempts
        self.handed_off = False  # at most one hand-off: later attempts come from fact changes

    def _read_back(self, key: TopicPartitionKey, high: int) -> ErrorCode | None:
        if threading.get_ident() == self.loop_thread:
            if not self.handed_off:
                self.handed_off = True
                self.attempts.submit(self._attempt)
            return None  # still waiting, here: the executor's attempt reads
        return super()._read_back(key, high)

    def _attempt(self) -> None:
        try:
            self.safe_try_complete()
        except Exception:
            # The op stays watched and timed, so it still finishes (next fact change, or expiry).
            _log.exception("produce_attempt_failed", operation=type(self).__name__)


# Journals, metrics and the Spark analytics group operations by class name: to them this is
# Kafka's DelayedProduce.
OffLoopProduce.__name__ = OffLoopProduce.__qualname__ = DelayedProduce.__name__
