"""Journal: a purgatory listener that hands lifecycle events to sinks off the hot path."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from .._outcome import Outcome
from ._event import EventType, JournalEvent, event_type_for
from ._sink import JournalSink

if TYPE_CHECKING:
    from .._operation import DelayedOperation
    from .._purgatory import DelayedOperationPurgatory

__all__ = ["Journal", "JournalStats", "SinkStats"]

_log = structlog.get_logger("purgatory.journal")

DEFAULT_CAPACITY = 100_000  # ~1 s of a busy purgatory; beyond that the sinks are not keeping up
DEFAULT_BATCH_SIZE = 1_000  # events per sink call: amortises the sink's per-call cost
DEFAULT_FLUSH_INTERVAL_S = 0.1  # how long an idle writer sleeps; the longest an event waits queued
CLOSE_TIMEOUT_S = 30.0  # close() waits this long for the writer to drain, then gives up loudly


@dataclass(frozen=True, slots=True)
class SinkStats:
    """One sink's counts. ``written``: events the sink has made durable — for a sink that confirms
    delivery later (``delivery_counts()``, the Kafka sink), only acknowledged events. ``failed``:
    events whose write raised, plus those whose delivery failed."""

    sink: str
    written: int
    failed: int


@dataclass(frozen=True, slots=True)
class JournalStats:
    """Counters: events accepted into the queue, written and failed (summed over the sinks, so an
    event written by two sinks counts twice; ``sinks`` has each one's counts), dropped, queued."""

    accepted: int
    written: int
    dropped: int
    failed: int
    queued: int
    sinks: tuple[SinkStats, ...] = ()


class Journal:
    """Records every operation's lifecycle to sinks without slowing the purgatory's hot path.

    Attach it with ``purgatory.add_listener(journal)`` (or :meth:`attach`). The purgatory calls
    :meth:`on_submitted` and :meth:`on_finished` on the submitting or finishing thread; those only
    capture a few fields and the clocks into a tuple and append it to a bounded queue — no JSON,
    no I/O, no lock, never a wait. The writer thread (``purgatory-journal-<name>``) takes batches of
    up to ``batch_size``, builds the :class:`JournalEvent` objects (ids, strings, latency) and hands
    each batch to every sink in turn.

    What is recorded: ``created`` when the purgatory is handed the operation (before its first
    ``try_complete``), and one finish event when it finishes. An operation refused at submission
    (``PurgatoryFullError``, or its ``try_complete`` raising) or taken back by ``cancel_for_key``
    and never finished has a ``created`` event only; the analytics count it as created. An
    operation answered without ever being handed to a purgatory (the Kafka adapter's refusals: a
    partition that does not exist, shutting down, Kafka not answering the request that had to
    come first) is recorded by its owner with :meth:`record_unsubmitted`: both events at once.

    What the caller saw (:class:`~purgatory.journal.AnsweredOperation`, optional): an operation
    with ``requested_ns`` gets its finish latency from then (the caller's whole wait, checks and
    sends before the submission included), and one with ``answer_code()`` gets its finish event's
    ``error_code``. Both are read by the writer thread, not on the finishing thread.

    Back-pressure: when ``capacity`` events are queued the new event is dropped and counted
    (``stats().dropped``); the caller is never blocked. The capacity check and the append are two
    steps, so concurrent callers may overshoot ``capacity`` by at most their number.

    Ids: ``op_id`` is ``<journal id>-<id(op) hex>-<submitted_ns hex>``. ``id(op)`` is unique among
    live objects and ``submitted_ns`` (monotonic, set at each submission) separates two operations
    that reused one address; the random journal id separates processes. Event ids derive from it
    (:mod:`._event`), so a re-sent event keeps its id.

    Concurrency contract: ``on_submitted``/``on_finished`` may be called from any number of
    threads at once. ``flush`` and ``close`` from any thread; ``close`` is idempotent. Events
    offered after ``close`` are dropped and counted. Sinks are only called on the writer thread.

    Example::

        journal = Journal([FileJournalSink("journal/")])
        purgatory.add_listener(journal)
        ...
        purgatory.shutdown()
        journal.close()  # drains the queue into the sinks, then closes them
    """

    def __init__(
        self,
        sinks: Sequence[JournalSink],
        *,
        capacity: int = DEFAULT_CAPACITY,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        name: str = "journal",
    ) -> None:
        if not sinks:
            raise ValueError("sinks must name at least one JournalSink; got none")
        for sink in sinks:
            if not isinstance(sink, JournalSink):
                raise TypeError(f"sink {sink!r} does not implement JournalSink (write, flush, close)")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0 seconds, got {flush_interval_s!r}")
        self.name = name
        self.journal_id = uuid.uuid4().hex[:12]
        self._sinks = list(sinks)
        self._capacity = capacity
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        # deque.append/popleft are atomic in CPython: producers and the writer share it lock-free.
        self._queue: collections.deque[Any] = collections.deque()
        self._closed = False
        self._stopping = threading.Event()
        # Only the overload path takes this lock; accepted events are counted by the writer.
        self._drop_lock = threading.Lock()
        self._dropped = 0
        # Per sink, by position in self._sinks (writer thread only): events write() accepted,
        # events in batches whose write() raised.
        self._written = [0] * len(self._sinks)
        self._failed = [0] * len(self._sinks)
        self._taken = 0  # writer thread only
        self._prepared = False
        self._prepare_lock = threading.Lock()
        self._writer = threading.Thread(target=self._run, name=f"purgatory-journal-{name}", daemon=True)
        self._writer.start()

    # -- listener (hot path) ------------------------------------------------------------------

    def on_submitted(self, purgatory: str, op: DelayedOperation, keys: Sequence[Hashable]) -> None:
        queue = self._queue
        if len(queue) >= self._capacity or self._closed:
            self._drop()
            return
        # tuple(keys): the caller may reuse its list; str() of the keys waits for the writer.
        queue.append((None, purgatory, op, tuple(keys), op.submitted_ns, time.time_ns()))

    def on_finished(self, purgatory: str, op: DelayedOperation) -> None:
        queue = self._queue
        if len(queue) >= self._capacity or self._closed:
            self._drop()
            return
        # Both clocks read now, on the finishing thread: latency must not include queueing.
        queue.append((op.outcome, purgatory, op, None, op.submitted_ns, time.time_ns(), time.monotonic_ns()))

    def record_unsubmitted(self, purgatory: str, op: DelayedOperation, keys: Sequence[Hashable]) -> None:
        """Record ``op``, answered (finished) without being handed to ``purgatory``: its
        ``created`` and finish events, as if it had been submitted and finished now.

        Off the hot path (refusals); the same bounded queue and drop rule as the listener calls.
        """
        if op.outcome is None:
            raise ValueError(f"{op!r} is not finished: record_unsubmitted records answered operations")
        queue = self._queue
        if len(queue) + 1 >= self._capacity or self._closed:
            self._drop()
            self._drop()
            return
        # A fresh stamp for the op's id: it was never submitted, so op.submitted_ns may be 0 for
        # every such op, and two of them at one address must not share an id (dedup drops one).
        stamp, wall = time.monotonic_ns(), time.time_ns()
        queue.append((None, purgatory, op, tuple(keys), stamp, wall))
        queue.append((op.outcome, purgatory, op, None, stamp, wall, stamp))

    def attach(self, purgatory: DelayedOperationPurgatory[Any]) -> Journal:
        """Journal ``purgatory``'s operations; the first attach prepares the sinks (see :meth:`prepare`)."""
        self.prepare()
        purgatory.add_listener(self)
        return self

    def prepare(self) -> None:
        """Let each sink check its destination once (a sink's optional ``prepare()``); errors raise.

        The Kafka sink checks (or creates) its topic here: a journal that could write nothing
        fails when the service starts, not once per event afterwards. Idempotent.
        """
        with self._prepare_lock:
            if self._prepared:
                return
            for sink in self._sinks:
                prepare = getattr(sink, "prepare", None)
                if prepare is not None:
                    prepare()
            self._prepared = True

    def _drop(self) -> None:
        with self._drop_lock:
            self._dropped += 1

    # -- control ------------------------------------------------------------------------------

    def stats(self) -> JournalStats:
        with self._drop_lock:
            dropped = self._dropped
        queued = len(self._queue)  # may include a flush marker or two: close enough for a gauge
        sinks = tuple(self._sink_stats(index, sink) for index, sink in enumerate(self._sinks))
        return JournalStats(
            accepted=self._taken + queued,
            written=sum(s.written for s in sinks),
            dropped=dropped,
            failed=sum(s.failed for s in sinks),
            queued=queued,
            sinks=sinks,
        )

    def _sink_stats(self, index: int, sink: JournalSink) -> SinkStats:
        counts = getattr(sink, "delivery_counts", None)
        if counts is None:
            return SinkStats(repr(sink), self._written[index], self._failed[index])
        # Handing events to a client's queue is not writing them: count acknowledgements.
        delivered, undelivered = counts()
        return SinkStats(repr(sink), delivered, self._failed[index] + undelivered)

    def flush(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until every event queued before this call reached the sinks and they flushed.

        Returns False if ``timeout_s`` passed first (a sink is stuck); the events stay queued.
        """
        if not self._writer.is_alive():
            return not self._queue
        marker = threading.Event()
        self._queue.append(marker)  # a marker bypasses the capacity: it is not an event
        return marker.wait(timeout_s)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop accepting events, drain the queue into the sinks, close them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._writer.join(timeout_s)
        if self._writer.is_alive():
            _log.error("journal_close_timed_out", journal=self.name, queued=len(self._queue))
            return
        for sink in self._sinks:
            try:
                sink.close()
            except Exception:
                _log.exception("journal_sink_close_failed", journal=self.name, sink=repr(sink))

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        queue = self._queue
        while True:
            batch: list[JournalEvent] = []
            markers: list[threading.Event] = []
            while queue and len(batch) < self._batch_size:
                item = queue.popleft()
                if isinstance(item, threading.Event):
                    markers.append(item)
                    break  # a flush marker: write what came before it, then flush
                batch.append(self._event(item))
            if batch:
                self._taken += len(batch)
                self._write(batch)
            if markers:
                self._flush_sinks()
                for marker in markers:
                    marker.set()
                continue
            if not queue:
                if self._stopping.is_set():
                    self._flush_sinks()
                    return
                self._stopping.wait(self._flush_interval_s)

    def _event(self, item: tuple[Any, ...]) -> JournalEvent:
        outcome: Outcome | None = item[0]
        op = item[2]
        op_id = f"{self.journal_id}-{id(op):x}-{item[4]:x}"
        ts_ms = item[5] // 1_000_000
        if outcome is None:
            return JournalEvent(
                event_id=f"{op_id}:created",
                event_type=EventType.CREATED,
                op_id=op_id,
                op_type=type(op).__name__,
                purgatory=item[1],
                ts_ms=ts_ms,
                # str(): Kafka-style keys print as their label (``orders-3``).
                keys=tuple(str(key) for key in item[3]),
                timeout_ms=op.delay_ms,
            )
        event_type = event_type_for(outcome)
        finished_ns: int = item[6]
        # The caller's wait when the op says when it was asked (AnsweredOperation): from then,
        # not from the submission (the checks and sends before it are part of what it saw).
        requested_ns = getattr(op, "requested_ns", 0)
        started_ns = requested_ns if 0 < requested_ns <= finished_ns else item[4]
        answer_code = getattr(op, "answer_code", None)
        return JournalEvent(
            event_id=f"{op_id}:{event_type.value}",
            event_type=event_type,
            op_id=op_id,
            op_type=type(op).__name__,
            purgatory=item[1],
            ts_ms=ts_ms,
            latency_ms=(finished_ns - started_ns) / 1_000_000,
            error_code=None if answer_code is None else self._answer_code(answer_code),
        )

    def _answer_code(self, answer_code: Any) -> str | None:
        try:
            code = answer_code()
        except Exception:  # an op's own code must not stop the writer (every later event lost)
            _log.exception("journal_answer_code_failed", journal=self.name)
            return None
        return code if isinstance(code, str) else str(code)

    def _write(self, batch: list[JournalEvent]) -> None:
        for index, sink in enumerate(self._sinks):
            try:
                sink.write(batch)
                self._written[index] += len(batch)
            except Exception:
                # A failing sink must not kill the writer (every later event would be lost).
                self._failed[index] += len(batch)
                _log.exception(
                    "journal_sink_write_failed", journal=self.name, sink=repr(sink), events=len(batch)
                )

    def _flush_sinks(self) -> None:
        for sink in self._sinks:
            try:
                sink.flush()
            except Exception:
                _log.exception("journal_sink_flush_failed", journal=self.name, sink=repr(sink))
