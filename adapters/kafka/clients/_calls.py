"""KafkaCalls: blocking Kafka client calls awaited from asyncio, on a dedicated bounded pool, each
with its own deadline.

Why not ``asyncio.to_thread`` / ``run_in_executor(None, ...)``: the loop's default executor has
``min(32, cores + 4)`` threads (6 on a 2-core machine) shared by everything in the process. With
a partition leader SIGSTOPped every produce, metadata and offset call blocks its thread for its
whole client timeout, so the next requests *queue* behind them and are answered after several
timeouts in a row (measured: 37.7 s against a stated 18 s). Here:

* each kind of call (metadata, appends, reads) has its own pool, so a stalled append never
  delays a metadata lookup;
* ``run(fn, ..., timeout_s=...)`` answers within ``timeout_s`` whatever the thread does: on
  expiry a :class:`KafkaUnavailableError` names the call and the bound (the call itself ends on
  its own client timeout; a call still queued is cancelled and never runs);
* at most ``max_pending`` calls are admitted (running or queued): past that a call is refused
  at once (unavailable) instead of queueing without end while Kafka does not answer.

Concurrency contract: thread-safe; ``run`` must be awaited on a running event loop. ``close``
lets running calls finish (they are bounded by their client timeouts) and refuses new ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ._errors import KafkaUnavailableError

__all__ = ["KafkaCalls"]

T = TypeVar("T")


class KafkaCalls:
    """A named pool of ``workers`` threads admitting at most ``max_pending`` calls (module doc)."""

    def __init__(self, name: str, workers: int, max_pending: int) -> None:
        if workers < 1 or max_pending < workers:
            raise ValueError(
                f"need 1 <= workers <= max_pending, got workers={workers}, max_pending={max_pending}"
            )
        self.name = name
        self.workers = workers
        self.max_pending = max_pending
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"kafka-calls-{name}")
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        self.refused = 0  # calls refused because max_pending were admitted (read by metrics/tests)
        self.timed_out = 0  # calls whose caller stopped waiting at the deadline

    @property
    def pending(self) -> int:
        """Calls admitted and not finished (running, or queued for a thread)."""
        return self._pending

    def _admit(self, what: str) -> None:
        with self._lock:
            if self._closed:
                raise KafkaUnavailableError(f"{what}: the Kafka client pool {self.name!r} is closed")
            if self._pending >= self.max_pending:
                self.refused += 1
                raise KafkaUnavailableError(
                    f"{what}: {self._pending} Kafka calls already pending on {self.name!r} "
                    "(Kafka is slow or unreachable)"
                )
            self._pending += 1

    def _finished(self, _future: Future[Any]) -> None:
        with self._lock:
            self._pending -= 1

    async def run(self, fn: Callable[..., T], /, *args: Any, timeout_s: float, what: str) -> T:
        """``fn(*args)`` on this pool; its result, or :class:`KafkaUnavailableError` after ``timeout_s``."""
        self._admit(what)
        try:
            future = self._pool.submit(fn, *args)
        except RuntimeError:  # the pool shut down between the admission and the submit
            self._finished(Future())
            raise KafkaUnavailableError(f"{what}: the Kafka client pool {self.name!r} is closed") from None
        # The slot is given back when the *thread* is done (or the queued call is cancelled),
        # not when the caller stops waiting: max_pending bounds the threads' backlog.
        future.add_done_callback(self._finished)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError:
            self.timed_out += 1
            raise KafkaUnavailableError(f"Kafka did not answer {what} within {timeout_s:.1f} s") from None

    def submit(self, fn: Callable[[], Any], /) -> Future[Any]:
        """``fn()`` on this pool, not awaited (a completion attempt handed off the event loop);
        admitted as :meth:`run` (raises :class:`KafkaUnavailableError` when full or closed)."""
        what = getattr(fn, "__qualname__", "a call")
        self._admit(what)
        try:
            future = self._pool.submit(fn)
        except RuntimeError:
            self._finished(Future())
            raise KafkaUnavailableError(f"{what}: the Kafka client pool {self.name!r} is closed") from None
        future.add_done_callback(self._finished)
        return future

    def close(self) -> None:
        """Refuse new calls; queued ones are cancelled, running ones end on their client timeouts."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
