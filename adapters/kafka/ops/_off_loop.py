"""OffLoopReplication: a DelayedReplication that never reads records back on the event loop's thread.

A :class:`DelayedReplication` given record identities answers ``NONE`` only after reading the
records at their offsets back (see there: a deposed leader's ``acks=1`` append). Its first completion
attempt runs on the calling thread — the event loop's, in the service — and when the high
watermark has already passed the offset (a quick replication) that read would happen right then:
a Kafka round trip when the shared record cache misses, during which no other request of the
loop makes progress. So, as :class:`OffLoopFetch` does for records, an attempt on the loop's
thread that needs a read declines and hands *this operation's* attempt to ``attempts`` (the
gateway's small executor), where the real attempt — and the read — happens. Anywhere else (the
change feed's thread, the executor) it behaves exactly as :class:`DelayedReplication`.

Used by the HTTP service's ``GET /topics/{t}/replicated``, whose first attempt runs inside
``purgatory.watch`` on the loop. A hand-off the executor
refuses (shut down, full) is logged; the operation stays watched, so the next change of its facts
(the feed's thread) or its expiry still finishes it.

Concurrency contract: as :class:`DelayedReplication`; the hand-off as in :class:`OffLoopFetch`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from ..facts._keys import TopicPartitionKey
from ._replication import DelayedReplication
from ._results import ErrorCode

__all__ = ["Attempts", "OffLoopReplication"]

_log = structlog.get_logger("purgatory.kafka.replication")


class Attempts(Protocol):
    """Runs a completion attempt on another thread (a ``ThreadPoolExecutor``, :class:`KafkaCalls`)."""

    def submit(self, fn: Callable[[], None], /) -> object: ...


class OffLoopReplication(DelayedReplication):
    """:class:`DelayedReplication` reading its records back off ``loop_thread`` (see the module docstring)."""

    def __init__(self, *args: Any, loop_thread: int, attempts: Attempts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop_thread = loop_thread
        self.attempts = attempts
        self.handed_off = False  # at most one hand-off: later attempts come from fact changes

    def _read_back(self, key: TopicPartitionKey, high: int) -> ErrorCode | None:
        if threading.get_ident() == self.loop_thread:
            if not self.handed_off:
                self.handed_off = True
                try:
                    self.attempts.submit(self._attempt)
                except Exception:
                    # Refused (shutting down, full): still watched, so a fact change or expiry ends it.
                    _log.warning("replication_attempt_not_handed_off", exc_info=True)
            return None  # still waiting, here: the executor's attempt reads
        return super()._read_back(key, high)

    def _attempt(self) -> None:
        try:
            self.safe_try_complete()
        except Exception:
            # The op stays watched and timed, so it still finishes (next fact change, or expiry).
            _log.exception("replication_attempt_failed", operation=type(self).__name__)


# Journals, metrics and the Spark analytics group operations by class name: to them this is
# DelayedReplication.
OffLoopReplication.__name__ = OffLoopReplication.__qualname__ = DelayedReplication.__name__
