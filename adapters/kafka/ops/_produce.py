"""DelayedProduce: a produce held until Kafka's delivery report has come for each of its records.

Kafka's broker keeps a produce with ``acks=all`` in its Produce purgatory until every in-sync
replica has the records (``DelayedProduce``: completes when the high watermark passes them, or
fails when the ISR is below ``min.insync.replicas``). A client cannot wait better than the
leader: so the records go through the idempotent producer (``enable.idempotence``, which is
``acks=all``), the leader's purgatory does the replication wait, and this operation's completion
check consults the answer Kafka gave — the delivery report of each record. The producer's own
retries ride out leader changes and broker crashes within ``message.timeout.ms``, without
duplicates or reordering (the producer id and per-partition sequence numbers let the new leader
drop a batch it already has; up to five requests in flight keep their order).

Why not ``acks=1`` and a watch of the high watermark, as until 2026-11: that moves a problem
the broker already solves into a client. It needed leader-epoch fences and a read-back of each
record to avoid answering "replicated" for a record a leader change discarded, and could never
resend (a resend of a batch the broker already had would append it twice), so every leader
change became an error; measured 0.11x a plain producer's throughput at 7x its CPU.

The operation is watched on a key of its own (:class:`ProduceRequestKey`), not on its
partitions: nothing the change feed polls says when a record is acknowledged, so no partition
needs polling; the delivery report that completes the last record is the key event
(``check_and_complete``), and the purgatory's timer answers ``REQUEST_TIMED_OUT`` at the
deadline for records not reported by then. Those may still be written later (the producer keeps
retrying until ``message.timeout.ms``): exactly what Kafka's own ``REQUEST_TIMED_OUT`` of a
produce means — not known, retry and expect a possible duplicate.

Concurrency contract: delivery reports arrive on the sender's thread (or a flushing thread);
they write one record's slot each and count down under ``_reports`` (a plain lock, never held
while calling out). ``try_complete`` reads the count under ``op.lock``; ``_respond`` runs once.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

from confluent_kafka import KafkaError, Message

from purgatory._loop_handoff import LoopHandoff

from ..clients._clients import ProducerRecord, _typed
from ..clients._errors import KafkaAdapterError, KafkaUnavailableError, RecordTooLargeError, UnknownTopicError
from ..facts._facts import FactSource
from ..facts._keys import KafkaKey, TopicPartitionKey, partition_key
from ._operations import KafkaOperation
from ._results import ErrorCode, ProduceResult

__all__ = ["DelayedProduce", "ProduceRequestKey", "delivery_status"]


class _KeyEvents(Protocol):
    def check_and_complete(self, key: Hashable) -> int: ...


_ids = itertools.count(1)


class ProduceRequestKey:
    """The watch key of one produce request: its delivery reports are its only key event."""

    __slots__ = ("id",)

    def __init__(self, request_id: int) -> None:
        self.id = request_id

    @property
    def label(self) -> str:
        return f"produce-request-{self.id}"

    def __str__(self) -> str:
        return self.label

    def __repr__(self) -> str:
        return f"ProduceRequestKey({self.id})"


# Delivery errors by librdkafka code (KafkaError.code()) and the ErrorCode a partition gets.
_STATUS_OF_CODE: dict[int, ErrorCode] = {
    KafkaError.NOT_ENOUGH_REPLICAS: ErrorCode.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.MSG_SIZE_TOO_LARGE: ErrorCode.MESSAGE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE: ErrorCode.MESSAGE_TOO_LARGE,
    KafkaError.UNKNOWN_TOPIC_OR_PART: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    KafkaError._UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    KafkaError._UNKNOWN_PARTITION: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    KafkaError._MSG_TIMED_OUT: ErrorCode.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT: ErrorCode.REQUEST_TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT: ErrorCode.REQUEST_TIMED_OUT,
}


def delivery_status(error: KafkaError) -> ErrorCode:
    """The :class:`ErrorCode` of a record whose delivery report carries ``error``."""
    return _STATUS_OF_CODE.get(error.code(), ErrorCode.UNKNOWN_SERVER_ERROR)


def _refusal_status(error: KafkaAdapterError) -> ErrorCode:
    # A record that never reached Kafka: refused when queued, or held past its deadline.
    if isinstance(error, RecordTooLargeError):
        return ErrorCode.MESSAGE_TOO_LARGE
    if isinstance(error, UnknownTopicError):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(error, KafkaUnavailableError):
        return ErrorCode.REQUEST_TIMED_OUT  # queue full, or not sent in time: not written
    return ErrorCode.UNKNOWN_SERVER_ERROR


class DelayedProduce(KafkaOperation):
    """Completes when every record has its delivery report (``acks=all``); see the module docstring.

    Build it with the records (checked :class:`ProducerRecord` values), submit it, then queue
    each record with ``functools.partial(op.delivered, i)`` as its delivery callback:
    ``KafkaPurgatory.produce`` does both.

    Attributes:
        records: the request's records, in order.
        offsets: per record, its offset once delivered (None otherwise).
        record_statuses: per record, None while unreported, then its :class:`ErrorCode`.
        partitions: per record, the partition it went to (the record's own, or the one the
            producer's partitioner chose, known from its report; None if none was chosen).
        error: the typed error of the first record that failed.

    ``result()`` returns these as a :class:`ProduceResult` once finished.
    """

    __slots__ = (
        "_mailbox",
        "_purgatory",
        "_reports",
        "_unreported",
        "key",
        "offsets",
        "partitions",
        "record_statuses",
        "records",
    )

    def __init__(
        self,
        facts: FactSource,
        records: Iterable[ProducerRecord],
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.produce_timeout_ms,
            facts,
            on_response=on_response,
        )
        records = tuple(records)  # the request's records, copied once (a caller's list may change)
        count = len(records)
        if count == 1 and type(records[0]) is ProducerRecord:
            partitions: list[int | None] = [records[0].partition]  # the common request, checked
        else:
            if not count:
                raise ValueError("DelayedProduce needs at least one record")
            for i, record in enumerate(records):
                if not isinstance(record, ProducerRecord):
                    raise TypeError(f"records[{i}] must be a ProducerRecord, got {type(record).__name__}")
            partitions = [r.partition for r in records]
        self.records = records
        self.offsets: list[int | None] = [None] * count
        self.record_statuses: list[ErrorCode | None] = [None] * count
        self.partitions = partitions
        self._unreported = count
        self._reports = threading.Lock()
        self.key = ProduceRequestKey(next(_ids))
        # Set by the sender before the first record goes out: where the last report's key event
        # is raised (delivered). None: the owner raises it (report's return value).
        self._purgatory: _KeyEvents | None = None
        # Set by an asyncio caller: reports are applied on its event loop, in batches (delivered).
        self._mailbox: LoopHandoff | None = None

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return (self.key,)  # type: ignore[return-value]  # not a Kafka key: the feed ignores it

    def delivered(self, index: int, error: KafkaError | None, message: Message) -> None:
        """librdkafka's delivery callback of ``records[index]`` (bound with ``functools.partial``).

        On the sender's thread, once per record. For an asyncio caller the report goes to its
        event loop's mailbox and is applied there (``_apply``), in one batch per wake-up: the
        sender thread then does little per record under the GIL, and the op completes on the
        loop that awaits it, so no second hand-off carries its outcome back (each cross-thread
        step of a record held the GIL on both threads: ``purgatory bench produce``). For a
        thread caller it is applied here.
        """
        mailbox = self._mailbox
        if mailbox is not None:
            mailbox.post_call(self._apply, (index, error, message))
        else:
            self._apply((index, error, message))

    def _apply(self, report: tuple[int, KafkaError | None, Message]) -> None:
        index, error, message = report
        typed = None
        if error is not None:
            topic = self.records[index].topic
            typed = _typed(error, f"topic {topic!r}: record not delivered", topic=topic)
        if self.report(index, typed, message) and self._purgatory is not None:
            self._purgatory.check_and_complete(self.key)

    def report(self, index: int, error: KafkaAdapterError | None, message: Message | None) -> bool:
        """Record ``records[index]``'s delivery report; True iff it was the last one outstanding.

        The caller then calls ``check_and_complete(op.key)``: the key event that completes the
        operation (``_apply`` does, for a delivery report; ``KafkaPurgatory`` for a refusal).
        """
        # The partition the producer chose (known from its report; -1: none was chosen).
        partition = message.partition() if message is not None else None
        if error is None:
            offset = message.offset() if message is not None else None
            status = ErrorCode.NONE
        else:
            offset = None
            kafka_error = message.error() if message is not None else None
            status = delivery_status(kafka_error) if kafka_error is not None else _refusal_status(error)
        with self._reports:
            if self.record_statuses[index] is not None:
                return False  # reported already (a record is reported once; defensive)
            if partition is not None and partition >= 0:
                self.partitions[index] = partition
            self.offsets[index] = offset
            self.record_statuses[index] = status
            if error is not None and self.error is None:
                self.error = error
            self._unreported -= 1
            return self._unreported == 0

    def try_complete(self) -> bool:
        return self._unreported == 0 and self.force_complete()

    def _set_status(self, key: TopicPartitionKey | None, code: ErrorCode) -> None:
        # refuse() (the whole request answered before anything was sent), and _respond: every
        # record not reported yet gets ``code``.
        with self._reports:
            for i, status in enumerate(self.record_statuses):
                if status is None:
                    self.record_statuses[i] = code

    def _respond(self) -> None:
        # Not reported by the deadline (or by shutdown): not known whether written. An outage
        # shows as REQUEST_TIMED_OUT, Kafka's own answer for it; the producer keeps the record's
        # sequence number, so a later write of it is never a duplicate.
        if self._unreported == 0:
            return  # every record reported: nothing undecided (the common finish)
        self._set_status(None, ErrorCode.SHUTTING_DOWN if self.shutting_down else ErrorCode.REQUEST_TIMED_OUT)

    def _respond_moved(self) -> None:
        # A produce is not owned by an instance (any instance appends to any partition): it is
        # never moved. Answered as a timeout should it be, which says what it is: not known.
        self._respond()

    def _answer_statuses(self) -> list[ErrorCode | None]:
        return self.record_statuses  # per record: a refusal before a partition was chosen counts

    @property
    def succeeded(self) -> bool:
        """True iff every record was delivered."""
        return all(status is ErrorCode.NONE for status in self.record_statuses)

    @property
    def appended(self) -> dict[TopicPartitionKey, int]:
        """The last offset delivered per partition so far (a new dict per read)."""
        return dict(self._by_partition()[0])

    @property
    def statuses(self) -> dict[TopicPartitionKey, ErrorCode]:
        """Per partition: ``NONE`` when all its records reported so far were delivered, else the
        first error among them (records not reported yet are not counted; a new dict per read)."""
        return dict(self._by_partition()[1])

    def result(self) -> ProduceResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        if len(self.records) == 1:
            # One record, the common request: the general walk below costs ~4 µs more per answer
            # on the event loop (four tuples, two dicts, a zip), all for one entry.
            offset, code, partition = self.offsets[0], self.record_statuses[0], self.partitions[0]
            code = code or ErrorCode.REQUEST_TIMED_OUT
            if partition is None:
                return ProduceResult(outcome, {}, {}, self.error, (offset,), (code,))
            key = partition_key(self.records[0].topic, partition)
            appended = {key: offset} if offset is not None else {}
            return ProduceResult(outcome, appended, {key: code}, self.error, (offset,), (code,))
        appended, statuses, offsets, codes = self._by_partition()
        return ProduceResult(outcome, appended, statuses, self.error, offsets, codes)

    def _by_partition(
        self,
    ) -> tuple[
        dict[TopicPartitionKey, int],
        dict[TopicPartitionKey, ErrorCode],
        tuple[int | None, ...],
        tuple[ErrorCode, ...],
    ]:
        with self._reports:
            offsets = tuple(self.offsets)
            codes = tuple(s or ErrorCode.REQUEST_TIMED_OUT for s in self.record_statuses)
            reported = tuple(s is not None for s in self.record_statuses)
            partitions = tuple(self.partitions)
        appended: dict[TopicPartitionKey, int] = {}
        statuses: dict[TopicPartitionKey, ErrorCode] = {}
        for record, partition, offset, code, known in zip(
            self.records, partitions, offsets, codes, reported, strict=True
        ):
            if partition is None or (not known and not self.is_completed()):
                continue
            key = partition_key(record.topic, partition)
            if offset is not None and offset > appended.get(key, -1):
                appended[key] = offset
            if statuses.get(key, ErrorCode.NONE) is ErrorCode.NONE:
                statuses[key] = code
        return appended, statuses, offsets, codes
