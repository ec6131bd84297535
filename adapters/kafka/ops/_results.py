"""What each Kafka operation answered: frozen, public dataclasses with documented fields.

``await kp.produce(...)`` (and the other awaitables of :class:`AsyncKafkaPurgatory`) return one
of these; ``op.result()`` builds the same snapshot from a finished operation. They hold plain
values (no clients, no locks), so a web handler can turn them into a response directly.

Per-partition ``statuses`` use Kafka's error names (:class:`ErrorCode`): ``NONE`` is success.
Kafka-side conditions are answered here, never raised: an unreachable cluster
(``KAFKA_UNAVAILABLE``), a topic or partition that does not exist (``UNKNOWN_TOPIC_OR_PARTITION``),
a leader that moved (``NOT_LEADER_OR_FOLLOWER``), a purgatory shutting down (``SHUTTING_DOWN``).
Exceptions are left for the caller's own mistakes (a bad argument, a closed purgatory).

An HTTP handler maps them as the example service does: ``SHUTTING_DOWN`` and
``KAFKA_UNAVAILABLE`` to 503 with ``Retry-After`` (``result.shutting_down`` /
``result.unavailable``), ``UNKNOWN_TOPIC_OR_PARTITION`` to 404, ``REQUEST_TIMED_OUT`` to 504.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from purgatory import Outcome

from ..clients._clients import FetchedRecord
from ..clients._errors import KafkaAdapterError
from ..facts._keys import TopicPartitionKey

__all__ = [
    "CommitResult",
    "DeleteRecordsResult",
    "ErrorCode",
    "FetchResult",
    "ProduceResult",
    "ReplicationResult",
    "TopicReadyResult",
]


class ErrorCode(StrEnum):
    """Per-partition result codes, named as Kafka's ``Errors``."""

    NONE = "NONE"
    NOT_ENOUGH_REPLICAS = "NOT_ENOUGH_REPLICAS"
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    TOPIC_AUTHORIZATION_FAILED = "TOPIC_AUTHORIZATION_FAILED"
    # A refusal without a name of its own above; the result's ``error`` says what it was.
    UNKNOWN_SERVER_ERROR = "UNKNOWN_SERVER_ERROR"
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
    # Ours, not Kafka's (no Kafka error says "the client could not reach any broker" or "the
    # client is closing"); named as the HTTP service names its 503 answers. Both mean: nothing
    # was decided, retry (elsewhere, or after Retry-After).
    KAFKA_UNAVAILABLE = "KAFKA_UNAVAILABLE"  # Kafka did not answer until the operation's deadline
    SHUTTING_DOWN = "SHUTTING_DOWN"  # the purgatory was shut down while the operation waited


class _AskAgain:
    """``shutting_down`` and ``unavailable`` of a result, from the codes it holds (``_codes``):
    the statuses that say "nothing was decided: ask again later" (503 + Retry-After)."""

    __slots__ = ()

    def _codes(self) -> Iterable[ErrorCode]:
        raise NotImplementedError

    @property
    def shutting_down(self) -> bool:
        """True iff the purgatory shut down before this was decided (some status ``SHUTTING_DOWN``)."""
        return ErrorCode.SHUTTING_DOWN in self._codes()

    @property
    def unavailable(self) -> bool:
        """True iff Kafka did not answer in time for part of it (some status ``KAFKA_UNAVAILABLE``)."""
        return ErrorCode.KAFKA_UNAVAILABLE in self._codes()


def _all_none(statuses: Mapping[TopicPartitionKey, ErrorCode | None]) -> bool:
    return bool(statuses) and all(status is ErrorCode.NONE for status in statuses.values())


@dataclass(frozen=True, slots=True)
class ProduceResult(_AskAgain):
    """The answer to a produce held until Kafka acknowledged it with ``acks=all`` (:class:`DelayedProduce`).

    A record is delivered when the partition leader answered the idempotent producer's request
    with success: every in-sync replica has it, and there are at least ``min.insync.replicas``
    of them (the leader's own purgatory did that wait).

    Attributes:
        outcome: ``COMPLETED`` once every record was reported, ``EXPIRED`` at the timeout (the
            records not reported then are ``REQUEST_TIMED_OUT``), ``CANCELLED`` if the awaiting
            task was cancelled.
        appended: the last offset delivered per partition (only partitions with a delivered record).
        statuses: per partition a record was delivered to or refused on: ``NONE`` when all of
            its records were delivered, else the first error among them — ``NOT_ENOUGH_REPLICAS``
            / ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (ISR below ``min.insync.replicas``),
            ``MESSAGE_TOO_LARGE``, ``UNKNOWN_TOPIC_OR_PARTITION``, ``TOPIC_AUTHORIZATION_FAILED``,
            ``REQUEST_TIMED_OUT`` (not acknowledged in time — a broker outage shows as this: it
            may still be written, once), ``SHUTTING_DOWN`` (the purgatory shut down first: it may
            still be written, once; the producer never writes it twice), or
            ``UNKNOWN_SERVER_ERROR`` (see ``error``).
        offsets: per record, in request order, the offset it was written at (None: not delivered).
        record_statuses: per record, in request order, its :class:`ErrorCode` (a record refused
            before a partition was chosen for it, as for an unknown topic, appears only here).
        error: the typed error of the first record that failed, or ``None``.
        succeeded: True iff every record was delivered.
        delivered: how many records were delivered.
        shutting_down: True iff a record is ``SHUTTING_DOWN`` (answer 503 + ``Retry-After``).
        unavailable: True iff a record is ``KAFKA_UNAVAILABLE``.
    """

    outcome: Outcome
    appended: Mapping[TopicPartitionKey, int]
    statuses: Mapping[TopicPartitionKey, ErrorCode]
    error: KafkaAdapterError | None = None
    offsets: tuple[int | None, ...] = ()
    record_statuses: tuple[ErrorCode, ...] = ()

    @property
    def succeeded(self) -> bool:
        """True iff every record was delivered (``acks=all``)."""
        return bool(self.record_statuses) and all(s is ErrorCode.NONE for s in self.record_statuses)

    @property
    def delivered(self) -> int:
        """How many of the request's records were delivered."""
        return sum(1 for offset in self.offsets if offset is not None)

    def _codes(self) -> Iterable[ErrorCode]:
        return self.record_statuses


@dataclass(frozen=True, slots=True)
class ReplicationResult(_AskAgain):
    """The answer to a wait for offsets someone appended to be replicated (:class:`DelayedReplication`).

    Attributes:
        outcome: ``COMPLETED`` once every partition has a final status, ``EXPIRED`` at the
            timeout, ``CANCELLED`` if the awaiting task was cancelled.
        appended: the offset waited for per partition.
        statuses: per partition: ``NONE`` (every in-sync replica has the offset),
            ``NOT_ENOUGH_REPLICAS`` (ISR below ``min.insync.replicas``), ``NOT_LEADER_OR_FOLLOWER``
            (the leader changed since the epoch given: the record may be lost),
            ``UNKNOWN_TOPIC_OR_PARTITION``, ``REQUEST_TIMED_OUT`` (not replicated in time), or
            ``SHUTTING_DOWN`` (the purgatory shut down first).
        error: the typed error that ended it early, or a ``KafkaUnavailableError`` when it
            expired while Kafka was unreachable; ``None`` otherwise.
        succeeded: True iff every partition's status is ``NONE``.
        shutting_down: True iff a status is ``SHUTTING_DOWN`` (answer 503 + ``Retry-After``).
        unavailable: True iff a status is ``KAFKA_UNAVAILABLE``.
    """

    outcome: Outcome
    appended: Mapping[TopicPartitionKey, int]
    statuses: Mapping[TopicPartitionKey, ErrorCode]
    error: KafkaAdapterError | None = None

    @property
    def succeeded(self) -> bool:
        """True iff every partition's status is ``NONE`` (replicated)."""
        return _all_none(self.statuses)

    def _codes(self) -> Iterable[ErrorCode]:
        return self.statuses.values()


@dataclass(frozen=True, slots=True)
class FetchResult(_AskAgain):
    """The answer to a long poll (:class:`DelayedFetch`).

    Attributes:
        outcome: ``COMPLETED`` (enough data, or an error ended it), ``EXPIRED`` (``max_wait_ms``
            passed: ``records`` holds whatever had arrived; or the purgatory shut down),
            ``CANCELLED``.
        records: records read per partition from the fetch offsets, at most ``max_bytes`` each.
        statuses: per partition: ``NONE``, ``OFFSET_OUT_OF_RANGE``, ``UNKNOWN_TOPIC_OR_PARTITION``
            (answered at once, for a topic or a partition that does not exist),
            ``NOT_LEADER_OR_FOLLOWER`` (the partition moved to another instance),
            ``KAFKA_UNAVAILABLE`` (expired while Kafka did not answer) or ``SHUTTING_DOWN``.
        error: the typed error behind a non-``NONE`` status (``InvalidOffsetError``,
            ``UnknownTopicError``, ``KafkaUnavailableError``); ``None`` otherwise.
        succeeded: True iff every status is ``NONE`` and there is no error.
        shutting_down: True iff a status is ``SHUTTING_DOWN`` (answer 503 + ``Retry-After``).
        unavailable: True iff a status is ``KAFKA_UNAVAILABLE`` (answer 503 + ``Retry-After``).
    """

    outcome: Outcome
    records: Mapping[TopicPartitionKey, list[FetchedRecord]]
    statuses: Mapping[TopicPartitionKey, ErrorCode]
    error: KafkaAdapterError | None = None

    @property
    def succeeded(self) -> bool:
        """True iff every partition's status is ``NONE`` and no error ended the fetch."""
        return self.error is None and _all_none(self.statuses)

    def _codes(self) -> Iterable[ErrorCode]:
        return self.statuses.values()


@dataclass(frozen=True, slots=True)
class CommitResult(_AskAgain):
    """The answer to "has group G processed up to these offsets?" (:class:`DelayedConsumerCommit`).

    Attributes:
        outcome: ``COMPLETED`` once the group committed at least every target (or at once for a
            partition that does not exist), ``EXPIRED``, ``CANCELLED``.
        group: the consumer group.
        targets: the offsets waited for per partition (a record at offset ``n`` is processed
            once the group's committed offset is ``n + 1``).
        committed: the group's last committed offset seen per partition (``None``: none seen).
        statuses: per partition: ``NONE`` (committed >= target), ``REQUEST_TIMED_OUT`` (the
            group had not caught up), ``UNKNOWN_TOPIC_OR_PARTITION`` (answered at once: the topic
            or partition does not exist), ``KAFKA_UNAVAILABLE`` (expired while Kafka did not
            answer), ``NOT_LEADER_OR_FOLLOWER`` (moved to another instance) or ``SHUTTING_DOWN``.
        error: the typed error behind a status (``UnknownTopicError``, ``KafkaUnavailableError``),
            else ``None``.
        uncommitted: the partitions where Kafka answered that the group has no committed offset
            at all (a group never seen, or one that never committed there): the barrier can only
            pass once its consumers start committing.
        succeeded: True iff every partition's status is ``NONE``.
        nothing_committed: True iff the group had committed nothing on any target partition.
        shutting_down: True iff a status is ``SHUTTING_DOWN`` (answer 503 + ``Retry-After``).
        unavailable: True iff a status is ``KAFKA_UNAVAILABLE`` (answer 503 + ``Retry-After``).
    """

    outcome: Outcome
    group: str
    targets: Mapping[TopicPartitionKey, int]
    committed: Mapping[TopicPartitionKey, int | None]
    statuses: Mapping[TopicPartitionKey, ErrorCode]
    error: KafkaAdapterError | None = None
    uncommitted: frozenset[TopicPartitionKey] = frozenset()

    @property
    def succeeded(self) -> bool:
        """True iff the group committed at least the target on every partition."""
        return _all_none(self.statuses)

    @property
    def nothing_committed(self) -> bool:
        """True iff Kafka said the group has no committed offset on any target partition."""
        return bool(self.targets) and self.uncommitted >= self.targets.keys()

    def _codes(self) -> Iterable[ErrorCode]:
        return self.statuses.values()


@dataclass(frozen=True, slots=True)
class TopicReadyResult(_AskAgain):
    """The answer to "wait until the topic exists and every partition has a leader".

    Attributes:
        outcome: ``COMPLETED`` when ready, ``EXPIRED``, ``CANCELLED``.
        topic: the topic.
        ready: True iff the topic exists and every partition has a leader.
        leaders: the leader broker id per partition, as last seen (empty: not seen yet).
        error: ``KafkaUnavailableError`` when Kafka did not answer in time, else ``None``.
        status: ``NONE`` when ready, ``REQUEST_TIMED_OUT`` (not ready in time),
            ``KAFKA_UNAVAILABLE`` (Kafka did not answer: the creation or the wait) or
            ``SHUTTING_DOWN``.
        succeeded: same as ``ready``.
        shutting_down: True iff ``status`` is ``SHUTTING_DOWN`` (answer 503 + ``Retry-After``).
        unavailable: True iff ``status`` is ``KAFKA_UNAVAILABLE`` (answer 503 + ``Retry-After``).
    """

    outcome: Outcome
    topic: str
    ready: bool
    leaders: tuple[int, ...]
    error: KafkaAdapterError | None = None
    status: ErrorCode = ErrorCode.NONE

    @property
    def succeeded(self) -> bool:
        """Same as ``ready``."""
        return self.ready

    def _codes(self) -> Iterable[ErrorCode]:
        return (self.status,)


@dataclass(frozen=True, slots=True)
class DeleteRecordsResult(_AskAgain):
    """The answer to a DeleteRecords held until the log start offsets moved (:class:`DelayedDeleteRecords`).

    Attributes:
        outcome: ``COMPLETED`` when every log start offset reached its target, ``EXPIRED``,
            ``CANCELLED``.
        targets: the offsets records were deleted before, per partition.
        log_start_offsets: the log start offset last seen per partition.
        statuses: per partition: ``NONE``, ``UNKNOWN_TOPIC_OR_PARTITION`` (answered at once),
            ``OFFSET_OUT_OF_RANGE`` (Kafka refused the target offset), ``REQUEST_TIMED_OUT``,
            ``KAFKA_UNAVAILABLE`` (Kafka did not answer the request or the wait: DeleteRecords is
            idempotent, ask again), ``NOT_LEADER_OR_FOLLOWER`` or ``SHUTTING_DOWN``.
        error: the typed error that ended it early, or ``KafkaUnavailableError``; else ``None``.
        succeeded: True iff every partition's status is ``NONE``.
        shutting_down: True iff a status is ``SHUTTING_DOWN`` (answer 503 + ``Retry-After``).
        unavailable: True iff a status is ``KAFKA_UNAVAILABLE`` (answer 503 + ``Retry-After``).
    """

    outcome: Outcome
    targets: Mapping[TopicPartitionKey, int]
    log_start_offsets: Mapping[TopicPartitionKey, int | None]
    statuses: Mapping[TopicPartitionKey, ErrorCode]
    error: KafkaAdapterError | None = None

    @property
    def succeeded(self) -> bool:
        """True iff every partition's log start offset reached its target."""
        return _all_none(self.statuses)

    def _codes(self) -> Iterable[ErrorCode]:
        return self.statuses.values()
