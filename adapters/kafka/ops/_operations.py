"""KafkaOperation, the base of every Kafka-backed delayed operation: completion decided by cluster facts.

Each operation reads facts from a :class:`FactSource` (the change feed's snapshot) in
``try_complete`` — never a request of its own — and names the keys it must be watched on in
``watch_keys()``. Submit with ``purgatory.try_complete_else_watch(op, op.watch_keys())`` (or
``await purgatory.watch(op, op.watch_keys())``) on a purgatory the feed is attached to.
The operations themselves have a file each: ``_fetch`` (DelayedFetch, PartitionRead),
``_replication`` (DelayedReplication), ``_produce`` (DelayedProduce), ``_metadata_waits``
(commits, topic readiness, deleted records), ``_off_loop`` (variants completed off the loop).

Results: ``op.result()`` returns a frozen snapshot (:class:`ReplicationResult`, :class:`FetchResult`,
:class:`CommitResult`, :class:`TopicReadyResult`, :class:`DeleteRecordsResult`; each documents its
fields) once the operation finished. The same fields live on the operation while it runs.
``op.error`` is the typed error that ended it early (unknown topic, bad offset), or, for an
operation that expired while the cluster was unreachable, a :class:`KafkaUnavailableError` saying
so. ``op.done`` is set after ``on_complete``; ``op.wait(timeout)`` blocks on it. Per-partition
``ErrorCode`` values use Kafka's error names.

Kafka-side conditions are statuses, not exceptions: a partition still undecided when the
operation ends is ``KAFKA_UNAVAILABLE`` if it expired while Kafka did not answer, and
``SHUTTING_DOWN`` if the purgatory drained it at shutdown (:func:`draining`); an operation found
unanswerable before it was submitted (a partition that does not exist, a purgatory shutting
down) is finished at once with :meth:`KafkaOperation.refuse`.

Concurrency contract: as :class:`purgatory.DelayedOperation` — ``try_complete`` runs under
``op.lock`` on the submitting thread or the feed thread; ``on_complete`` runs once, on whichever
thread finished the operation (feed, timer executor, or submitter).
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import structlog

from purgatory import DelayedOperation, Outcome

from .._metrics import ANSWERS
from ..clients._errors import InvalidOffsetError, KafkaAdapterError, KafkaUnavailableError
from ..facts._facts import FactSource
from ..facts._keys import KafkaKey, TopicPartitionKey
from ._moved import Moved
from ._results import (
    ErrorCode,
)

__all__ = ["ErrorCode", "KafkaOperation", "draining"]

# Guards the lazy creation of an operation's completion event against its setting: held for a
# few bytecodes, once per operation that finishes and once per first use of ``op.done``.
_DONE_LOCK = threading.Lock()
_log = structlog.get_logger("purgatory.kafka")
# answer_code's codes, read once per answer: module constants, not enum attribute lookups.
_NONE, _TIMED_OUT = ErrorCode.NONE, ErrorCode.REQUEST_TIMED_OUT
_NONE_CODE: str = ErrorCode.NONE.value
_UNAVAILABLE_CODE: str = ErrorCode.KAFKA_UNAVAILABLE.value
_UNKNOWN_SERVER_ERROR_CODE: str = ErrorCode.UNKNOWN_SERVER_ERROR.value
# Set on the thread that drains purgatories at shutdown: the core's drain expires each pending
# operation on the calling thread (DelayedOperationPurgatory.shutdown), so an EXPIRED claim made
# on that thread while this is set is the drain's — and one made by the reaper on its own thread
# at the same moment is a real expiry. Thread-local: no lock, no field on the core's operations.
_DRAIN = threading.local()


@contextmanager
def draining() -> Iterator[None]:
    """While active, operations expired on this thread answer ``SHUTTING_DOWN`` (not a timeout).

    ``KafkaPurgatory.stop`` wraps its ``purgatory.shutdown(drain=True)`` calls in it.
    """
    _DRAIN.active = True
    try:
        yield
    finally:
        _DRAIN.active = False


def _drained_here() -> bool:
    return getattr(_DRAIN, "active", False)


def _require_offsets(what: str, offsets: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
    if not offsets:
        raise ValueError(f"{what} must name at least one partition")
    out = {}
    for key, offset in offsets.items():
        if not isinstance(key, TopicPartitionKey):
            raise TypeError(f"{what}: keys must be TopicPartitionKey, got {key!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidOffsetError(f"{what}: offset for {key.label} must be an int >= 0, got {offset!r}")
        out[key] = offset
    return out


class KafkaOperation(DelayedOperation):
    """Base of the Kafka operations: facts source, error, completion event, response callback.

    Attributes:
        facts: the :class:`FactSource` completion is decided from (a :class:`ChangeFeed`).
        error: the typed error that ended the operation early, or ``None``.
        done: a ``threading.Event`` set once ``on_complete`` has run.
        on_response: called once with the operation, on the finishing thread, after its fields
            are final (a response callback; exceptions are logged and counted).
        requested_ns: ``time.monotonic_ns()`` when it was built, i.e. when the caller asked:
            the start of the latency the journal records (checks and sends before the
            submission included: what the caller waited).

    Each finished operation is counted once by its answer (``answer_code``) in
    ``purgatory_kafka_answers_total`` (``_metrics``), refusals before any wait included.
    """

    # Slotted: the service holds tens of thousands of waiting operations, and an instance dict
    # cost ~340 B of each (a subclass that declares no __slots__ of its own gets one back).
    __slots__ = (
        "_done",
        "_moving",
        "_responded",
        "error",
        "facts",
        "moved",
        "on_response",
        "requested_ns",
        "shutting_down",
    )

    # Whether try_complete reads log start offsets: the feed polls ListOffsets(earliest) only
    # for partitions some watcher needs it for.
    needs_log_start = False
    # True for a type whose ``high_watermark_needed`` is exact (see there): the change feed then
    # tries an operation on a high-watermark advance only once it reaches what the operation
    # needs (OffsetIndex), instead of on every change of the partition.
    indexed_by_high_watermark = False

    def __init__(
        self,
        delay_ms: int,
        facts: FactSource,
        *,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(delay_ms)
        self.requested_ns = time.monotonic_ns()
        self.facts = facts
        self.error: KafkaAdapterError | None = None
        self.on_response = on_response
        # The completion event is built on first use (wait() or .done): a threading.Event is a
        # Condition, a lock and a deque, ~1 KB; the service's 50k waiters are answered through
        # asyncio and never ask for it (purgatory bench fanout).
        self._done: threading.Event | None = None
        self._responded = False
        # Set by move() when the operation's partition went to another instance: it then finished
        # COMPLETED at once, answered NOT_LEADER_OR_FOLLOWER (see _ownership). _moving is the
        # intent, read by on_complete only if move()'s own claim won.
        self.moved: Moved | None = None
        self._moving: Moved | None = None
        # True once it was drained at shutdown or refused because the purgatory is shutting
        # down: the partitions still undecided answer SHUTTING_DOWN (see _undecided_status).
        self.shutting_down = False

    @abstractmethod
    def watch_keys(self) -> tuple[KafkaKey, ...]:
        """The keys whose facts decide this operation."""

    @abstractmethod
    def _respond(self) -> None:
        """Build the response fields (runs once, inside ``on_complete``)."""

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        """The partitions that carry a status in the result (none: the result has one status)."""
        return ()

    def _set_status(self, key: TopicPartitionKey | None, code: ErrorCode) -> None:
        """Record ``code`` as ``key``'s final status (``None``: the operation's only status)."""
        statuses: dict[TopicPartitionKey, ErrorCode | None] | None = getattr(self, "statuses", None)
        if statuses is not None and key is not None:
            statuses[key] = code

    def _undecided_status(self) -> ErrorCode:
        """The status of a partition not decided when the operation ended (not by its condition)."""
        if self.shutting_down:
            return ErrorCode.SHUTTING_DOWN
        if isinstance(self.error, KafkaUnavailableError):
            return ErrorCode.KAFKA_UNAVAILABLE
        return ErrorCode.REQUEST_TIMED_OUT

    def refuse(
        self,
        code: ErrorCode,
        error: KafkaAdapterError | None = None,
        keys: Iterable[TopicPartitionKey] | None = None,
    ) -> bool:
        """Finish an operation that was *not submitted* at once: ``keys`` (default: all of its
        partitions) get ``code``, the others the status of an undecided partition; True iff this
        call finished it.

        For answers known before any wait: a partition that does not exist
        (``UNKNOWN_TOPIC_OR_PARTITION``), Kafka unreachable for the request that had to come
        first (``KAFKA_UNAVAILABLE``), a purgatory shutting down (``SHUTTING_DOWN``). The outcome
        is ``COMPLETED`` (an error ended it, as for ``_fail``).
        """
        self.error = error if self.error is None else self.error
        self.shutting_down = code is ErrorCode.SHUTTING_DOWN
        targets: list[TopicPartitionKey | None] = list(self._status_keys() if keys is None else keys)
        for key in targets or [None]:  # None: an operation whose result has a single status
            self._set_status(key, code)
        return self.force_complete()

    def _answer_statuses(self) -> Iterable[ErrorCode | None]:
        """The final statuses of the answer (a ``statuses`` mapping by default)."""
        statuses: Mapping[TopicPartitionKey, ErrorCode | None] | None = getattr(self, "statuses", None)
        return () if statuses is None else statuses.values()

    def answer_code(self) -> str:
        """The caller's answer in one code, once finished: ``NONE`` when every status is
        ``NONE``, else the first other status (an undecided one as ``REQUEST_TIMED_OUT``, as
        ``result()`` shows it); with no status to say it, the error's (``KAFKA_UNAVAILABLE``,
        else ``UNKNOWN_SERVER_ERROR``) or ``NONE``.

        What the journal records as ``error_code`` and the answers metric counts as ``status``:
        a COMPLETED operation with a code other than ``NONE`` completed *with an error*
        (``NOT_LEADER_OR_FOLLOWER`` included).
        """
        # Plain strs (``_value_``, not the ``.value`` descriptor, nor the member: a StrEnum
        # member hashes through Python code, and the metric's dict hashes the answer): this runs
        # once per answer, on the finishing thread.
        for status in self._answer_statuses():
            if status is not _NONE:
                return (status or _TIMED_OUT)._value_
        error = self.error
        if error is None:
            return _NONE_CODE
        return _UNAVAILABLE_CODE if isinstance(error, KafkaUnavailableError) else _UNKNOWN_SERVER_ERROR_CODE

    def _count_answer(self) -> None:
        try:
            ANSWERS.count(type(self).__name__, self.answer_code())
        except Exception:  # a metric must never stop an answer (user subclasses' statuses)
            _log.exception("answer_not_counted", operation=type(self).__name__)

    def high_watermark_needed(self, key: TopicPartitionKey) -> int | None:
        """The high watermark of ``key`` from which this operation may progress, or None if an
        advance of it alone never lets it (done with that partition already).

        The promise, for types that set ``indexed_by_high_watermark``: while ``key``'s leader,
        leader epoch, ISR, min ISR and error stay as they are, ``try_complete`` cannot finish
        the operation or change its state before the high watermark reaches this value. Any
        other change of ``key``'s facts still tries it (``check_and_complete``). The log start
        offset may move along with an advance unseen, so an indexed type must not read it
        (``DelayedFetch`` does — out of range — and is not indexed).
        """
        return None

    def move(self, moved: Moved) -> bool:
        """Finish now because the partition moved (``moved`` says where); True iff this call finished it.

        Taken under ``op.lock``, so no ``try_complete`` runs between the intent and the claim: a
        completion by the condition either happened first (then this returns False) or cannot
        happen. Expiry claims without the lock; ``on_complete`` honours the intent only for the
        COMPLETED claim, which is then this call's.
        """
        with self.lock:
            if self.is_completed():
                return False
            self._moving = moved
            return self.force_complete()

    def on_complete(self) -> None:
        if self._moving is not None and self.outcome is Outcome.COMPLETED:
            self.moved = self._moving
            try:
                self._respond_moved()
                self._count_answer()
                if self.on_response is not None:
                    self.on_response(self)
            finally:
                self.done.set()
            return
        try:
            if self.outcome is Outcome.EXPIRED and _drained_here():
                self.shutting_down = True  # drained by KafkaPurgatory.stop: not a timeout
            elif self.outcome is Outcome.EXPIRED and self.error is None and self.facts.unavailable:
                self.error = KafkaUnavailableError(
                    f"{type(self).__name__} expired while Kafka was unreachable: {self.facts.unavailable}"
                )
            self._respond()
            self._count_answer()
            if self.on_response is not None:
                self.on_response(self)
        finally:
            with _DONE_LOCK:  # orders this with a concurrent first use of .done (see there)
                self._responded = True
                event = self._done
            if event is not None:
                event.set()

    @property
    def done(self) -> threading.Event:
        """Set once ``on_complete`` has run (created on first use, already set if it has)."""
        event = self._done
        if event is None:
            with _DONE_LOCK:
                event = self._done
                if event is None:
                    event = self._done = threading.Event()
                    if self._responded:
                        event.set()
        return event

    def on_refused(self) -> None:
        """Its submission was refused (``PurgatoryFullError``, closed) after its first try ran:
        nothing will finish it, so it lets go of what that try took. Nothing here; see DelayedFetch."""

    def _respond_moved(self) -> None:
        """Answer the partitions still waiting ``NOT_LEADER_OR_FOLLOWER`` (no Kafka read: they moved)."""
        statuses: dict[TopicPartitionKey, ErrorCode | None] | None = getattr(self, "statuses", None)
        targets: Mapping[TopicPartitionKey, int] = getattr(self, "targets", {})
        if statuses is None:
            return
        for key in (*statuses, *targets):
            if statuses.get(key) is None:
                statuses[key] = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def wait(self, timeout_s: float) -> bool:
        """Block until finished (bounded); True iff it finished."""
        return self.done.wait(timeout_s)

    def _finished_outcome(self) -> Outcome:
        outcome = self.outcome
        # Finished: _responded (on_complete's finally), or the moved path's done.set(). Not
        # self.done.is_set() alone: that builds a threading.Event (a Condition, two locks) for
        # every operation nobody waits on (asyncio reads result() of each): ~1/7 of the event
        # loop's CPU per produce (purgatory bench produce, c256, cProfile).
        done = self._done
        if outcome is None or not (self._responded or (done is not None and done.is_set())):
            raise RuntimeError(f"{type(self).__name__}.result(): the operation has not finished yet")
        return outcome

    def _fail(self, error: KafkaAdapterError) -> bool:
        self.error = error
        return self.force_complete()
