"""Kafka-backed delayed operations: completion is decided by facts of a real cluster.

Each operation reads facts from a :class:`FactSource` (the change feed's snapshot) in
``try_complete`` — never a request of its own — and names the keys it must be watched on in
``watch_keys()``. Submit with ``purgatory.try_complete_else_watch(op, op.watch_keys())`` (or
``await purgatory.watch(op, op.watch_keys())``) on a purgatory the feed is attached to.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import structlog

from purgatory import DelayedOperation, Outcome

from .._metrics import ANSWERS
from ..clients._append import Appended, RecordReading
from ..clients._clients import LOG_END, FetchedRecord, RecordIdentity, RecordReader
from ..clients._errors import InvalidOffsetError, KafkaAdapterError, KafkaUnavailableError
from ..facts._facts import FactSource, PartitionFacts
from ..facts._keys import GroupPartitionKey, KafkaKey, TopicKey, TopicPartitionKey
from ._moved import Moved
from ._results import (
    CommitResult,
    DeleteRecordsResult,
    ErrorCode,
    FetchResult,
    ReplicationResult,
    TopicReadyResult,
)

__all__ = [
    "DelayedConsumerCommit",
    "DelayedDeleteRecords",
    "DelayedFetch",
    "DelayedReplication",
    "DelayedTopicReady",
    "ErrorCode",
    "KafkaOperation",
    "PartitionRead",
    "draining",
]

DEFAULT_FETCH_MAX_BYTES = 1 << 20  # Kafka's fetch.max.bytes per partition default is 1 MiB
# A replication wait's read-back reads on to the high watermark, this far (DelayedReplication._read_back).
READ_BACK_MAX_BYTES = 64 << 10
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


class DelayedReplication(KafkaOperation):
    """Holds an answer until every partition's high watermark passes an offset someone appended.

    (Until 2026-11 this was ``DelayedProduce`` itself, behind an ``acks=1`` append; a produce now
    waits for the idempotent producer's ``acks=all`` delivery reports, :class:`DelayedProduce`
    in ``_produce.py``. What stays here is the wait for offsets appended elsewhere:
    ``GET /topics/{t}/replicated``, ``kp.wait_replicated``.)

    ``appended`` says, per partition, the last offset to wait for and, when the caller knows it,
    the leader epoch that offset was appended in (an :class:`Appended`). A partition is done when
    the high watermark of that leader epoch passes the offset — every in-sync replica has the
    record — with status ``NONE``; with ``NOT_LEADER_OR_FOLLOWER`` as soon as the facts show
    another epoch (the leader changed: a record only the old leader had may be lost, and the new
    leader's watermark counts other records at its offset — Kafka's broker fails a waiting
    produce the same way); or with ``NOT_ENOUGH_REPLICAS`` as soon as its ISR is smaller than
    ``min.insync.replicas`` (Kafka 4 then keeps the high watermark still, see ``_status``). An
    unknown partition is done with ``UNKNOWN_TOPIC_OR_PARTITION``. On expiry the partitions still
    waiting get ``REQUEST_TIMED_OUT``. ``statuses`` holds the per-partition result.

    What the epoch fence protects, now that produces are ``acks=all``: a caller that appended
    with ``acks=1`` itself (or learnt an offset and epoch from one who did) is told when its
    record may have been lost to a leader change instead of being told a watermark passed.
    When ``appended`` also carries the identities of each partition's first and last record and
    a reader, ``NONE`` needs those records read back at their offsets (below the high watermark,
    so replicated): an epoch noted before an ``acks=1`` append cannot name a deposed leader that
    appended it without knowing it was deposed; another record there is
    ``NOT_LEADER_OR_FOLLOWER``. A read that brings nothing now (a stalled broker) leaves the
    partition waiting for the next change of its facts.

    ``appended`` may also be a plain mapping of *target* offsets (wait until the watermark
    reaches a position, whoever writes there): the epoch is then the one the facts show at
    construction, or the first one they show.

    Attributes:
        appended: last offset the leader appended per partition.
        leader_epochs: the leader epoch each partition's offset belongs to (None: not known yet).
        statuses: per partition, ``None`` while waiting, then the final :class:`ErrorCode`.
        succeeded: True iff every partition ended ``NONE``.

    ``result()`` returns these as a :class:`ReplicationResult` once finished.
    """

    def __init__(
        self,
        facts: FactSource,
        appended: Appended | Mapping[TopicPartitionKey, int],
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.produce_timeout_ms,
            facts,
            on_response=on_response,
        )
        self.statuses: dict[TopicPartitionKey, ErrorCode | None]
        # The reference epoch per partition; None: adopt the first one the facts show.
        self.leader_epochs: dict[TopicPartitionKey, int | None]
        # The records each partition must hold to be answered NONE, and how to read them.
        self.read_back: Mapping[TopicPartitionKey, tuple[RecordIdentity, ...]] = {}
        self.reader: RecordReading | None = None
        # Records appended (an Appended, the epochs noted before the append), not plain targets:
        # the fence must go wherever the wait goes (a MOVED answer, the service's _scaleout).
        self.fenced = isinstance(appended, Appended)
        if isinstance(appended, Appended):
            if appended.reader is not None:
                self.read_back, self.reader = appended.read_back, appended.reader
            self.appended = _require_offsets("DelayedReplication.appended", appended.offsets)
            self.leader_epochs = {k: appended.leader_epochs.get(k) for k in self.appended}
            # A partition whose epoch before the append is unknown (it did not exist yet when
            # the epochs were taken) cannot be vouched for: the client must retry.
            self.statuses = {
                k: None if e is not None else ErrorCode.NOT_LEADER_OR_FOLLOWER
                for k, e in self.leader_epochs.items()
            }
        else:
            self.appended = _require_offsets("DelayedReplication.appended", appended)
            self.leader_epochs = {k: _epoch_of(facts.partition(k)) for k in self.appended}
            self.statuses = dict.fromkeys(self.appended)
        self._single: tuple[TopicPartitionKey, int, int | None] | None = None
        if len(self.appended) == 1 and None in self.statuses.values():
            ((key, offset),) = self.appended.items()
            self._single = (key, offset, self.leader_epochs[key])

    # A partition waiting on a healthy leader is done only once the high watermark passes its
    # offset (_status): the feed tries it on that advance, not on every one (OffsetIndex).
    indexed_by_high_watermark = True

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(self.appended)

    def high_watermark_needed(self, key: TopicPartitionKey) -> int | None:
        """``appended[key] + 1`` while ``key`` waits (the watermark must *pass* the offset); a
        read-back that brought nothing leaves it waiting, tried again on each later advance."""
        offset = self.appended.get(key)
        if offset is None or self.statuses.get(key) is not None:
            return None
        return offset + 1

    def try_complete(self) -> bool:
        # Hot path: the feed re-checks every operation watched on a key whose facts changed
        # (~100 per key in the benchmark); a one-partition produce still waiting on a healthy
        # partition is answered with two lookups and three comparisons.
        single = self._single
        if single is not None:
            key, offset, epoch = single
            facts = self.facts.partition(key)
            if facts is None or (
                facts.error is None
                and facts.leader_epoch == epoch
                and not facts.under_min_isr
                and (facts.high_watermark is None or facts.high_watermark <= offset)
            ):
                return False
        waiting = False
        for key, offset in self.appended.items():
            if self.statuses[key] is not None:
                continue
            facts = self.facts.partition(key)
            epoch = self.leader_epochs[key]
            if epoch is None:
                # A target without a known epoch: the first epoch seen is the reference.
                epoch = self.leader_epochs[key] = _epoch_of(facts)
                if single is not None and epoch is not None:
                    self._single = (key, offset, epoch)
            status = self._status(facts, offset, epoch)
            if status is ErrorCode.NONE and key in self.read_back:
                assert facts is not None and facts.high_watermark is not None, "NONE: it passed the offset"
                status = self._read_back(key, facts.high_watermark)
            if status is None:
                waiting = True
            else:
                self.statuses[key] = status
        return False if waiting else self.force_complete()

    @staticmethod
    def _status(facts: PartitionFacts | None, offset: int, epoch: int | None) -> ErrorCode | None:
        if facts is None:
            return None  # not polled yet
        if facts.error is not None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if facts.error.kind == "unknown_topic" else None
        if facts.leader_epoch is None or epoch is None:
            return None  # no epoch in this answer: the watermark cannot be vouched for
        if facts.leader_epoch != epoch:
            # Another leader: its high watermark is a position in its own log, which may lack
            # the record (the old leader died before a follower fetched it). (docstring)
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if facts.under_min_isr:
            # Kafka 4 (eligible leader replicas, KIP-966) holds the high watermark still while the
            # ISR is below min.insync.replicas: waiting could only time out. An acks=all produce
            # gets NOT_ENOUGH_REPLICAS from the leader in this state; so does this operation.
            return ErrorCode.NOT_ENOUGH_REPLICAS
        if facts.high_watermark is None or facts.high_watermark <= offset:
            return None
        return ErrorCode.NONE

    def _read_back(self, key: TopicPartitionKey, high: int) -> ErrorCode | None:
        """``NONE`` if the records appended to ``key`` (below the high watermark ``high``) are the
        ones at their offsets, ``NOT_LEADER_OR_FOLLOWER`` if another record is at one of them;
        None if one could not be read now.

        Runs in ``try_complete`` (small reads, once per partition: the verdict is final); the
        service hands an attempt made on its event loop's thread to an executor instead
        (``OffLoopProduce``). Each read asks for the records up to ``high`` (at most
        ``READ_BACK_MAX_BYTES``), not one: through a :class:`SharedReadReader` the produces
        completed by the same watermark then read theirs from memory, one Kafka read for all.
        """
        assert self.reader is not None, "read_back comes with its reader"
        for identity in self.read_back[key]:
            try:
                records = self.reader.read(
                    key, identity.offset, max(high, identity.offset + 1), max_bytes=READ_BACK_MAX_BYTES
                )
            except KafkaAdapterError:
                return None  # the next change of the facts tries again; expiry answers meanwhile
            if not records:
                # (Also an offset gone from the log — deleted, compacted: the partition waits
                # and expires, never vouched for.)
                return None
            if not identity.matches(records[0]):
                return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return self.appended

    def _respond(self) -> None:
        # An outage keeps REQUEST_TIMED_OUT here (with error KafkaUnavailableError): the HTTP
        # service's /replicated answers 504 for it, as it always did.
        undecided = ErrorCode.SHUTTING_DOWN if self.shutting_down else ErrorCode.REQUEST_TIMED_OUT
        for key, status in self.statuses.items():
            if status is None:
                self.statuses[key] = undecided

    @property
    def succeeded(self) -> bool:
        """True iff every partition ended ``NONE`` (replicated to every in-sync replica)."""
        return all(status is ErrorCode.NONE for status in self.statuses.values())

    def result(self) -> ReplicationResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        statuses = {key: status or ErrorCode.REQUEST_TIMED_OUT for key, status in self.statuses.items()}
        return ReplicationResult(outcome, dict(self.appended), statuses, self.error)


_LOG_END = LOG_END  # an end offset past any log: read up to what the partition holds


def _epoch_of(facts: PartitionFacts | None) -> int | None:
    return facts.leader_epoch if facts is not None and facts.error is None else None


class PartitionRead:
    """One partition of a :class:`DelayedFetch`: where it reads from, what it read, how it ended.

    A waiting long poll is held by the thousands (50,000 per service process, issue 12): one
    slotted object per partition instead of six per-operation dicts keyed by partition (~1.5 KB
    of a one-partition fetch's ~2.5 KB, measured with tracemalloc). ``records`` stays the shared
    empty tuple until something is read.
    """

    __slots__ = ("bytes_read", "fetch_offset", "high_watermark", "key", "read_from", "records", "status")

    def __init__(self, key: TopicPartitionKey, fetch_offset: int) -> None:
        self.key = key
        self.fetch_offset = fetch_offset
        self.read_from = fetch_offset  # the next offset to read (each byte is read once)
        self.bytes_read = 0
        self.high_watermark: int | None = None  # last one checked in range (None: not known yet)
        self.records: Sequence[FetchedRecord] = ()  # a list once something was read
        self.status = ErrorCode.NONE

    def add(self, batch: list[FetchedRecord]) -> None:
        """Keep ``batch`` (read at ``read_from``) and move past it.

        ``batch`` is kept as it is, never changed: the shared record cache hands every long poll
        of a key event the same list (SharedReadReader, "the last answer, shared"), and the
        service renders one answer per list. A second read makes a new list.
        """
        self.records = [*self.records, *batch] if self.records else batch
        self.bytes_read += _size_of(batch)
        self.read_from = batch[-1].offset + 1


# The last batch sized by _size_of and its size: a key event adds the same batch to thousands of
# reads. One tuple, stored and read in one step (threads: the feed's, the timer's executor).
_last_sized: tuple[list[FetchedRecord], int] | None = None


def _size_of(batch: list[FetchedRecord]) -> int:
    global _last_sized
    last = _last_sized
    if last is not None and last[0] is batch:
        return last[1]
    size = sum(r.size for r in batch)
    _last_sized = (batch, size)
    return size


def _partition_reads(fetch_offsets: Mapping[TopicPartitionKey, int]) -> tuple[PartitionRead, ...]:
    return tuple(
        PartitionRead(key, offset)
        for key, offset in _require_offsets("DelayedFetch.fetch_offsets", fetch_offsets).items()
    )


class DelayedFetch(KafkaOperation):
    """Long poll: completes when the partitions hold enough past the fetch offsets, or at ``max_wait_ms``.

    Enough means ``min_records`` records in total (counted from high watermarks, no reads), or,
    when ``min_bytes`` is given, at least that many bytes of keys and values — read
    incrementally through ``reader`` as the high watermarks move (each byte is read once).
    A fetch offset below the log start or above the high watermark finishes the fetch at once
    with ``OFFSET_OUT_OF_RANGE`` and an :class:`InvalidOffsetError` (Kafka's behaviour); an
    unknown partition with ``UNKNOWN_TOPIC_OR_PARTITION``. ``records`` holds what was read per
    partition (on expiry: whatever had arrived), at most ``max_bytes`` per partition.

    Attributes:
        parts: one :class:`PartitionRead` per partition, in the order given (key, fetch offset,
            status, records): what the service reads when it answers.
        fetch_offsets: the offset each partition is read from (a new dict per read).
        records: records read per partition (a new dict of new lists per read).
        statuses: per partition: ``NONE``, ``OFFSET_OUT_OF_RANGE`` or ``UNKNOWN_TOPIC_OR_PARTITION``
            (a new dict per read).

    ``result()`` returns these as a :class:`FetchResult` once finished.
    """

    __slots__ = ("max_bytes", "min_bytes", "min_records", "parts", "reader")

    needs_log_start = True  # a fetch offset below the log start is out of range

    def __init__(
        self,
        facts: FactSource,
        reader: RecordReader,
        fetch_offsets: Mapping[TopicPartitionKey, int],
        *,
        min_records: int = 1,
        min_bytes: int | None = None,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        max_wait_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            max_wait_ms if max_wait_ms is not None else facts.settings.fetch_max_wait_ms,
            facts,
            on_response=on_response,
        )
        if isinstance(min_records, bool) or not isinstance(min_records, int) or min_records < 0:
            raise ValueError(f"min_records must be an int >= 0, got {min_records!r}")
        if min_bytes is not None and (not isinstance(min_bytes, int) or min_bytes < 0):
            raise ValueError(f"min_bytes must be an int >= 0 or None, got {min_bytes!r}")
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be an int > 0, got {max_bytes!r}")
        self.reader = reader
        self.parts = _partition_reads(fetch_offsets)
        self.min_records = min_records
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes

    @property
    def fetch_offsets(self) -> dict[TopicPartitionKey, int]:
        return {part.key: part.fetch_offset for part in self.parts}

    @property
    def records(self) -> dict[TopicPartitionKey, list[FetchedRecord]]:
        return {part.key: list(part.records) for part in self.parts}

    @property
    def statuses(self) -> dict[TopicPartitionKey, ErrorCode]:
        return {part.key: part.status for part in self.parts}

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(part.key for part in self.parts)

    def try_complete(self) -> bool:
        available = 0
        known = 0
        for part in self.parts:
            key, offset = part.key, part.fetch_offset
            facts = self.facts.partition(key)
            if facts is None:
                continue
            if facts.error is not None:
                if facts.error.kind == "unknown_topic":
                    part.status = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    return self._fail(facts.error.to_exception())
                continue
            high, start = facts.high_watermark, facts.log_start_offset
            if high is None:
                continue
            if offset > high or (start is not None and offset < start):
                part.status = ErrorCode.OFFSET_OUT_OF_RANGE
                return self._fail(
                    InvalidOffsetError(
                        f"fetch offset {offset} of {key.label} is out of range "
                        f"[log start {start}, high watermark {high}]"
                    )
                )
            part.high_watermark = high
            available += high - offset
        for part in self.parts:
            if part.high_watermark is not None:
                known += 1
        if known < len(self.parts):
            # Not every partition's range is known (or checked) yet: Kafka answers a fetch only
            # once each partition's offset was validated, even with min_bytes=0.
            enough_known = available >= self.min_records > 0 if self.min_bytes is None else False
            return self.force_complete() if enough_known else False
        if self.min_bytes is None:
            return self.force_complete() if available >= self.min_records else False
        return self.force_complete() if self._read_new() >= self.min_bytes else False

    def _read_new(self) -> int:
        """Read what arrived since the last read, up to ``max_bytes`` per partition; total bytes held."""
        total = 0
        for part in self.parts:
            high, start = part.high_watermark, part.read_from
            room = self.max_bytes - part.bytes_read
            if high is not None and high > start and room > 0:
                batch = self.reader.read(part.key, start, high, max_bytes=room)
                if batch:
                    part.add(batch)
            total += part.bytes_read
        return total

    def _respond_moved(self) -> None:
        for part in self.parts:  # NONE here means "no error yet", not "answered"
            part.status = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return [part.key for part in self.parts]

    def _set_status(self, key: TopicPartitionKey | None, code: ErrorCode) -> None:
        for part in self.parts:
            if part.key == key:
                part.status = code

    def _read_unreported(self) -> None:
        """Read what the log holds now for partitions the feed has not reported yet.

        A fetch that expires before the feed's first poll of its partition (``max_wait_ms`` 0 or
        a few ms) knows no high watermark there, so ``_read_new`` reads nothing — yet Kafka's
        fetch with ``max_wait_ms`` 0 answers with the records already there. The consumer never
        reads past the high watermark, so "to the end of the log" is the bound; ``max_bytes``
        and the read's timeout bound the rest. (An offset out of range reads nothing here; the
        caller's range check answers it.)
        """
        for part in self.parts:
            if part.high_watermark is not None or part.status is not ErrorCode.NONE:
                continue
            if self.facts.partition(part.key) is not None:
                continue  # reported, with an error or no high watermark: nothing known to read
            room = self.max_bytes - part.bytes_read
            if room <= 0:
                continue
            batch = self.reader.read(part.key, part.read_from, _LOG_END, max_bytes=room)
            if batch:
                part.add(batch)

    def _respond(self) -> None:
        if self.shutting_down or isinstance(self.error, KafkaUnavailableError):
            # Nothing decided these partitions (the records read so far stay): say why. Reading
            # on would stall the finishing thread on an unreachable cluster or a closing one.
            undecided = self._undecided_status()
            for part in self.parts:
                if part.status is ErrorCode.NONE:
                    part.status = undecided
            return
        if self.error is not None or self.facts.unavailable:
            return  # reading from an unreachable cluster would only stall the finishing thread
        try:
            # Expiry runs without op.lock; the feed thread may be reading in try_complete.
            with self.lock:
                self._read_new()
                self._read_unreported()
        except KafkaAdapterError as exc:
            self.error = exc

    def result(self) -> FetchResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        return FetchResult(outcome, self.records, self.statuses, self.error)


class DelayedConsumerCommit(KafkaOperation):
    """Completes when a consumer group has committed at least ``targets[partition]`` on every partition.

    The "my message has been processed" barrier: produce, then wait until the consuming group's
    committed offset passes the record (target = record offset + 1). ``committed`` holds the
    last committed offsets seen; on expiry ``statuses`` shows ``REQUEST_TIMED_OUT`` where the
    group had not caught up.

    Attributes:
        group: the consumer group.
        targets: the committed offset waited for per partition.
        committed: the group's last committed offset seen per partition (``None``: none yet).
        statuses: filled when finished: ``NONE`` or ``REQUEST_TIMED_OUT`` per partition.

    ``result()`` returns these as a :class:`CommitResult` once finished.
    """

    def __init__(
        self,
        facts: FactSource,
        group: str,
        targets: Mapping[TopicPartitionKey, int],
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.commit_timeout_ms,
            facts,
            on_response=on_response,
        )
        if not isinstance(group, str) or not group:
            raise ValueError(f"group must be a non-empty string, got {group!r}")
        self.group = group
        self.targets = _require_offsets("DelayedConsumerCommit.targets", targets)
        self.committed: dict[TopicPartitionKey, int | None] = dict.fromkeys(self.targets)
        self.statuses: dict[TopicPartitionKey, ErrorCode] = {}
        # Partitions whose committed offset Kafka answered at least once: a None there means the
        # group has none (never seen, or never committed there), not "not asked yet".
        self.answered: set[TopicPartitionKey] = set()

    def _key(self, tp: TopicPartitionKey) -> GroupPartitionKey:
        return GroupPartitionKey(self.group, tp.topic, tp.partition)

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(self._key(tp) for tp in self.targets)

    def try_complete(self) -> bool:
        reached = True
        for tp, target in self.targets.items():
            facts = self.facts.group(self._key(tp))
            if facts is None or facts.error is not None:
                reached = False
                continue
            self.committed[tp] = facts.committed
            self.answered.add(tp)
            reached &= facts.committed is not None and facts.committed >= target
        return self.force_complete() if reached else False

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return self.targets

    def _respond(self) -> None:
        undecided = self._undecided_status()
        for tp, target in self.targets.items():
            if tp in self.statuses:
                continue  # refused (unknown partition), or moved
            done = (self.committed[tp] or -1) >= target
            self.statuses[tp] = ErrorCode.NONE if done else undecided

    @property
    def uncommitted(self) -> frozenset[TopicPartitionKey]:
        """The partitions where Kafka answered that the group has no committed offset."""
        return frozenset(tp for tp in self.answered if self.committed[tp] is None)

    def result(self) -> CommitResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        return CommitResult(
            outcome,
            self.group,
            dict(self.targets),
            dict(self.committed),
            dict(self.statuses),
            self.error,
            self.uncommitted,
        )


class DelayedTopicReady(KafkaOperation):
    """Completes when ``topic`` exists and every one of its partitions has a leader.

    A topic that does not exist yet is waited for (it may be being created); on expiry
    ``ready`` is False and ``leaders`` shows the last leaders seen.

    Attributes:
        key: the :class:`TopicKey` watched.
        ready: True once the topic exists and every partition has a leader.
        leaders: the leader per partition, as last seen.

    ``result()`` returns these as a :class:`TopicReadyResult` once finished.
    """

    def __init__(
        self,
        facts: FactSource,
        topic: str,
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.topic_ready_timeout_ms,
            facts,
            on_response=on_response,
        )
        self.key = TopicKey(topic)
        self.leaders: tuple[int, ...] = ()
        self.ready = False
        self.status: ErrorCode | None = None  # set when finished (or refused)

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return (self.key,)

    def try_complete(self) -> bool:
        facts = self.facts.topic(self.key)
        if facts is None or facts.error is not None:
            return False
        self.leaders = facts.leaders
        return self.force_complete() if facts.all_partitions_have_leaders else False

    def _set_status(self, key: TopicPartitionKey | None, code: ErrorCode) -> None:
        self.status = code

    def _respond(self) -> None:
        self.ready = self.outcome is Outcome.COMPLETED and self.status is None
        if self.status is None:
            self.status = ErrorCode.NONE if self.ready else self._undecided_status()

    def _respond_moved(self) -> None:
        self.status = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def _answer_statuses(self) -> tuple[ErrorCode | None]:
        return (self.status,)

    def result(self) -> TopicReadyResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        status = self.status or ErrorCode.REQUEST_TIMED_OUT
        return TopicReadyResult(outcome, self.key.topic, self.ready, self.leaders, self.error, status)


class DelayedDeleteRecords(KafkaOperation):
    """Completes when every partition's log start offset has reached its target (Kafka's low watermark).

    Issue the DeleteRecords request yourself (``AdminClient.delete_records``, or use
    ``KafkaPurgatory.delete_records`` which does both); this holds the response until the
    deletion is visible. ``log_start_offsets`` holds the last values seen.

    Attributes:
        targets: the log start offset waited for per partition.
        log_start_offsets: the log start offset last seen per partition.
        statuses: filled when finished: ``NONE``, ``UNKNOWN_TOPIC_OR_PARTITION`` or
            ``REQUEST_TIMED_OUT`` per partition.

    ``result()`` returns these as a :class:`DeleteRecordsResult` once finished.
    """

    needs_log_start = True

    def __init__(
        self,
        facts: FactSource,
        targets: Mapping[TopicPartitionKey, int],
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.delete_records_timeout_ms,
            facts,
            on_response=on_response,
        )
        self.targets = _require_offsets("DelayedDeleteRecords.targets", targets)
        self.log_start_offsets: dict[TopicPartitionKey, int | None] = dict.fromkeys(self.targets)
        self.statuses: dict[TopicPartitionKey, ErrorCode] = {}

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(self.targets)

    def try_complete(self) -> bool:
        reached = True
        for key, target in self.targets.items():
            facts = self.facts.partition(key)
            if facts is not None and facts.error is not None and facts.error.kind == "unknown_topic":
                self.statuses[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                return self._fail(facts.error.to_exception())
            start = facts.log_start_offset if facts is not None else None
            self.log_start_offsets[key] = start
            reached &= start is not None and start >= target
        return self.force_complete() if reached else False

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return self.targets

    def _respond(self) -> None:
        undecided = self._undecided_status()
        for key, target in self.targets.items():
            if key not in self.statuses:
                done = (self.log_start_offsets[key] or -1) >= target
                self.statuses[key] = ErrorCode.NONE if done else undecided

    def result(self) -> DeleteRecordsResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        return DeleteRecordsResult(
            outcome, dict(self.targets), dict(self.log_start_offsets), dict(self.statuses), self.error
        )
