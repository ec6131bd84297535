"""OffLoopFetch: a DelayedFetch that never reads records on the event loop's thread.

``purgatory.watch(op, keys)`` makes the operation's first completion attempt on the calling
thread — the event loop's, in the service. A :class:`DelayedFetch` whose records are already
there reads them right then (``try_complete`` with ``min_bytes``, ``_respond`` in any case): a
Kafka round trip of ~10 ms measured, during which no other request of the loop makes progress.

So, on the loop's thread, ``try_complete`` declines (the operation is watched and timed as usual)
and the gateway at once calls ``purgatory.check_and_complete(key)`` from a worker thread, where
the attempt — and the read — really happens. Anywhere else (the change feed's thread, the worker,
the timer's executor on expiry) it behaves exactly as :class:`DelayedFetch`. A fetch cancelled
because its client left reads nothing: nobody is waiting for the records.

Concurrency contract: as :class:`DelayedFetch`. ``loop_thread`` is the ident of the thread
running the event loop that awaits the operation.
"""

from __future__ import annotations

import threading
from typing import Any

from purgatory import Outcome

from ..kafka import DelayedFetch

__all__ = ["OffLoopFetch"]


class OffLoopFetch(DelayedFetch):
    """:class:`DelayedFetch` deferring every attempt made on ``loop_thread`` (see the module docstring)."""

    def __init__(self, *args: Any, loop_thread: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop_thread = loop_thread

    def try_complete(self) -> bool:
        if threading.get_ident() == self.loop_thread:
            return False  # the gateway re-checks at once from a worker thread
        return super().try_complete()

    def _respond(self) -> None:
        if self.outcome is Outcome.CANCELLED:
            return  # the client left: reading records for nobody would only cost a round trip
        super()._respond()


# Journals, metrics and the Spark analytics group operations by class name; where an attempt
# runs is an implementation detail of the service: to them this is Kafka's DelayedFetch.
OffLoopFetch.__name__ = OffLoopFetch.__qualname__ = DelayedFetch.__name__
