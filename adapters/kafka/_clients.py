"""Thin, lazy, typed wrappers over confluent-kafka's Producer and Consumer for the operations.

:class:`RecordProducer` appends records with ``acks=1`` (the leader's append, as a Kafka producer
request that a ``DelayedProduce`` then holds until replication) and returns the offsets.
:class:`RecordReader` reads ``[start, end)`` of a partition for ``DelayedFetch``.

Both create their client on first use (no network in ``__init__``) and translate librdkafka
errors to the adapter's typed errors. Concurrency: thread-safe; the reader serialises reads on
one consumer with a lock (a fetch response is assembled on the thread that completes it).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from purgatory._loop_handoff import release_burst
from purgatory.settings import KafkaSettings

from ._config import APPEND_GUARANTEES, client_config
from ._errors import (
    AppendOutcomeUnknownError,
    InvalidOffsetError,
    InvalidTopicError,
    KafkaAdapterError,
    KafkaUnavailableError,
    RecordTooLargeError,
    UnknownTopicError,
)
from ._keys import TopicPartitionKey, _check_partition, _check_topic

__all__ = [
    "DIGEST_BYTES",
    "LOG_END",
    "READ_TIMEOUT_S",
    "FetchedRecord",
    "ProducerRecord",
    "RecordIdentity",
    "RecordProducer",
    "RecordReader",
    "producer_config",
]

READ_BATCH = 500  # messages per consume() call: amortises the call without holding much memory
# Broker-side fetch wait of the reader: 0. A read's range is known to exist, so no fetch of it
# needs to wait; but librdkafka prefetches past the record a read stops at (a Fetch at the next
# offset, the log's end), the broker holds that one for the whole wait, and the next read's
# Fetch on the same connection queues behind it: with 10 ms every read took ~12 ms instead of
# ~1 ms (debug=fetch; `purgatory bench produce`: the produce read-back was 4.6x a produce).
READ_WAIT_MS = "0"
READ_TIMEOUT_S = 2.0  # one read of a range known to exist; part of a long poll's answer bound
LOG_END = 2**63 - 1  # a read's end past any log: read up to what the partition holds now
# consume(n, timeout) returns after n events or the timeout, and an end of log is one event: a
# read asking for more records than the log holds (to LOG_END: 500) waited its whole timeout
# (2 s) with the end of log in hand. Each consume waits at most this long, then the loop looks.
CONSUME_SLICE_S = 0.02


@dataclass(frozen=True, slots=True)
class ProducerRecord:
    """One record to append. ``partition`` None: librdkafka's partitioner picks (by ``key``).

    Checked when built, so a bad record is refused with a ``TypeError`` / ``ValueError`` naming
    its field before any record of a request is sent (librdkafka would encode a ``str`` as UTF-8
    silently, read ``partition=-1`` as "any partition" and ``True`` as partition 1).
    """

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    # Kafka record headers, in order (a name may repeat): (name, value) pairs.
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def __post_init__(self) -> None:
        _check_topic(self.topic)
        for name in ("value", "key"):
            field_value = getattr(self, name)
            if field_value is not None and not isinstance(field_value, bytes):
                raise TypeError(
                    f"ProducerRecord.{name} must be bytes or None, got {type(field_value).__name__}"
                    + (" (encode it, e.g. .encode())" if isinstance(field_value, str) else "")
                )
        if self.partition is not None:
            _check_partition(self.partition)
        headers: object = self.headers  # typed as pairs; callers may pass any iterable of pairs
        if not isinstance(headers, tuple):
            if isinstance(headers, (str, bytes)) or not hasattr(headers, "__iter__"):
                raise TypeError(f"ProducerRecord.headers must be (name, value) pairs, got {headers!r}")
            headers = tuple(tuple(pair) for pair in headers)
            object.__setattr__(self, "headers", headers)
        for pair in headers:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not (pair[1] is None or isinstance(pair[1], bytes))
            ):
                raise TypeError(
                    f"ProducerRecord.headers: each header must be a (str, bytes | None) pair, got {pair!r}"
                )


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    # Kafka record headers, in order (a name may repeat). Filled by the tail (the reply router
    # routes on them); () where a reader has no use for them.
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @property
    def size(self) -> int:
        """Bytes of key and value (what ``min_bytes`` counts)."""
        return len(self.key or b"") + len(self.value or b"")


DIGEST_BYTES = 16  # of RecordIdentity.digest


def _digest(key: bytes | None, value: bytes | None) -> bytes:
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in (key, value):  # length-prefixed, and None apart from b"": no two records collide
        digest.update(b"\xff" * 8 if part is None else len(part).to_bytes(8, "big"))
        digest.update(part or b"")
    return digest.digest()


@dataclass(frozen=True, slots=True)
class RecordIdentity:
    """What tells a record an append wrote from another record later found at its offset: the
    offset, its timestamp (set by the producer, or the broker's append time) and a digest of its
    key and value. :class:`DelayedProduce` reads the record at the offset back and compares (see
    :class:`FencedAppender`: an epoch noted before an append cannot name the leader that
    appended when that leader was a deposed one that did not know it yet).
    """

    offset: int
    timestamp_ms: int  # -1: the producer knew none; then only the digest is compared
    digest: bytes

    @classmethod
    def of(cls, offset: int, key: bytes | None, value: bytes | None, timestamp_ms: int) -> RecordIdentity:
        return cls(offset, timestamp_ms, _digest(key, value))

    def matches(self, record: FetchedRecord) -> bool:
        """True iff ``record`` (read back at the offset) is the record appended."""
        if record.offset != self.offset:
            return False
        if self.timestamp_ms >= 0 and record.timestamp_ms != self.timestamp_ms:
            return False
        return _digest(record.key, record.value) == self.digest


def _typed(error: KafkaError, what: str) -> KafkaAdapterError:
    code = error.code()
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION):
        return UnknownTopicError(what, detail=error.str())
    if code == KafkaError.OFFSET_OUT_OF_RANGE:
        return InvalidOffsetError(f"{what}: offset out of range ({error.str()})")
    if code == KafkaError.TOPIC_EXCEPTION:
        return InvalidTopicError(f"{what}: Kafka refused the topic name ({error.str()})")
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return RecordTooLargeError(f"{what}: record too large ({error.str()})")
    if code in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE):
        # The producer does not retry (see RecordProducer): the caller does, at the new leader.
        return KafkaUnavailableError(f"{what}: the partition's leadership is moving, retry ({error.str()})")
    if code == KafkaError._PURGE_QUEUE:
        # Withdrawn unsent (RecordProducer.produce_identified, "withdrawn"): not in the log.
        return KafkaUnavailableError(
            f"{what}: not sent: withdrawn from the producer's queue after an earlier record's "
            "outcome became unknown (an append to a broker timed out or its connection dropped); "
            "retrying it is safe"
        )
    if code in (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
    ):
        return KafkaUnavailableError(f"{what}: Kafka did not answer ({error.str()})")
    return KafkaAdapterError(f"{what}: {error.str()}")


# Delivery errors after which a record may be in the log although no answer said so: the request
# was sent, then its connection dropped or its time ran out (librdkafka knows "possibly persisted"
# but does not expose it to Python). Any other error is the broker's refusal: nothing appended.
_OUTCOME_UNKNOWN = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._PURGE_INFLIGHT,
        KafkaError._DESTROY,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
    }
)


def _outcome_unknown(error: KafkaError) -> bool:
    return error.code() in _OUTCOME_UNKNOWN


def producer_config(
    settings: KafkaSettings, bootstrap_servers: str | None = None
) -> dict[str, str | int | bool]:
    """The append producer's librdkafka config: ``client_config`` and then, over it, the
    :data:`APPEND_GUARANTEES` (acks=1; why no idempotence and no retries: docs/design.md §4)."""
    return {
        **client_config(settings, bootstrap_servers),
        # acks=1: the leader's append answers the produce; DelayedProduce waits for the rest.
        # Idempotence would drop resent duplicates, but librdkafka (like the Java client) allows
        # it only with acks=all, which would move the replication wait into the broker. So: one
        # request in flight per connection (a request's records cannot be reordered), and no
        # retries — a batch whose connection dropped or timed out may have been appended anyway,
        # and resending it could append it twice. It fails instead, and produce() says its
        # outcome is unknown (AppendOutcomeUnknownError): never a silent duplicate.
        **APPEND_GUARANTEES,
        "linger.ms": "0",
        "log_level": "0",
        "socket.nagle.disable": True,  # latency over packet count: one record per produce
        # librdkafka gives up on a queued record when the append's bound has passed: a record
        # reported as failed must not land much later, behind the records of the next request
        # (or of the client's retry of this one).
        "message.timeout.ms": settings.append_timeout_ms,
    }


class RecordProducer:
    """Produces records with ``acks=1`` and reports each partition's last offset."""

    def __init__(
        self, settings: KafkaSettings | None = None, *, bootstrap_servers: str | None = None
    ) -> None:
        self._settings = settings or KafkaSettings()
        self._bootstrap = bootstrap_servers
        self._lock = threading.Lock()
        self._producer: Producer | None = None

    @property
    def producer(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(producer_config(self._settings, self._bootstrap))
            return self._producer

    def produce(
        self, records: Iterable[ProducerRecord], timeout_s: float = 10.0
    ) -> dict[TopicPartitionKey, int]:
        """Append ``records``; return the last offset appended per partition.

        Raises as :meth:`produce_identified`.
        """
        return self.produce_identified(records, timeout_s)[0]

    def produce_identified(
        self, records: Iterable[ProducerRecord], timeout_s: float = 10.0
    ) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, tuple[RecordIdentity, ...]]]:
        """Append ``records``; return the last offset appended per partition, and per partition
        the identities (:class:`RecordIdentity`) of the first and the last record appended there.

        Why the first too: one request's records to a partition may go out in several batches;
        should the producer learn of a new leader between two of them (another request's error
        refreshes its metadata), the first batch may have gone to a deposed leader and be lost
        while the last reached the new one.

        Raises the typed error of the first record if the broker refused every record (unknown
        topic, too large, ...: nothing was appended), else :class:`AppendOutcomeUnknownError`
        if any record was not acknowledged: some of the request may be in the log, and resending
        it may append those twice.

        **Withdrawn after an unknown outcome.** Once a record's outcome is unknown (its produce
        request timed out or its connection dropped), that request may still sit in the broker's
        socket buffer — a frozen leader appends it when it resumes — while librdkafka sends the
        records queued behind it on a *new* connection. The broker reads its connections in no
        set order, so those later records could land first: the request's records reordered in
        the log (CI saw it once in ~10 runs of the frozen-leader test). So on the first unknown
        outcome while the request still has records queued, the producer's queue is purged
        (``purge(in_queue=True)``: never what is in flight) before librdkafka can reconnect
        (``reconnect.backoff.ms``, >= 75 ms, against a callback served within a poll), and no
        further record of the request is queued. The withdrawn records are reported not
        appended (``_PURGE_QUEUE``): nothing after the unknown one reaches the log. The purge
        is producer-wide — other requests' queued records are withdrawn too and told so
        (retrying them is safe) — and happens only when a multi-record request meets a fault.
        """
        records = list(records)
        producer = self.producer
        last: dict[TopicPartitionKey, int] = {}
        # The records at the first and the last offset per partition: identified at the end.
        first_message: dict[TopicPartitionKey, Message] = {}
        last_message: dict[TopicPartitionKey, Message] = {}
        refused: list[KafkaAdapterError] = []  # the broker (or librdkafka) refused: not appended
        unknown: list[KafkaAdapterError] = []  # sent, then no answer: may or may not be appended
        outstanding = 0
        withdrawn = False  # an outcome became unknown: queue nothing more (docstring)
        # Guards ``outstanding`` and ``withdrawn``: callbacks run on whichever thread polls the
        # shared producer, possibly while this one is still queueing the request. Re-entrant:
        # librdkafka reports purged records from a later poll, never from inside purge(), but a
        # callback that did run nested must not deadlock.
        lock = threading.RLock()

        def delivered(error: KafkaError | None, message: Message) -> None:
            nonlocal outstanding, withdrawn
            with lock:
                outstanding -= 1
                if error is not None:
                    typed = _typed(error, f"topic {message.topic()!r}")
                    if not _outcome_unknown(error):
                        refused.append(typed)
                        return
                    unknown.append(typed)
                    if not withdrawn:
                        withdrawn = True
                        if outstanding > 0:  # records queued behind it: withdraw them (docstring)
                            producer.purge(in_queue=True, in_flight=False, blocking=True)
                    return
                key = TopicPartitionKey(message.topic() or "", message.partition() or 0)
                offset = message.offset() or 0
                if offset > last.get(key, -1):
                    last[key] = offset
                    last_message[key] = message
                first = first_message.get(key)
                if first is None or offset < (first.offset() or 0):
                    first_message[key] = message

        not_queued = 0
        for index, record in enumerate(records):
            with lock:
                if withdrawn:  # never handed to librdkafka: not appended
                    not_queued = len(records) - index
                    break
                try:
                    if record.partition is None:
                        producer.produce(
                            record.topic,
                            value=record.value,
                            key=record.key,
                            headers=list(record.headers) or None,
                            on_delivery=delivered,
                        )
                    else:
                        producer.produce(
                            record.topic,
                            record.value,
                            record.key,
                            record.partition,
                            headers=list(record.headers) or None,
                            on_delivery=delivered,
                        )
                except KafkaException as exc:  # refused before queueing (too large, bad partition): typed
                    error = _typed(exc.args[0], f"topic {record.topic!r}")
                    if index == 0:
                        raise error from None
                    # The records queued before this one are sent anyway: the request is split.
                    refused.append(error)
                    not_queued = len(records) - index - 1  # never handed to librdkafka: not appended
                    break
                outstanding += 1
        deadline = time.monotonic() + timeout_s
        while outstanding > 0 and time.monotonic() < deadline:
            producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
        # One snapshot, under the lock: another thread's poll() may still run a late callback of
        # ours (the producer is shared), which moves a record out of ``outstanding`` after this.
        # New names: rebinding ``refused``/``unknown`` would hand the callback the copies.
        with lock:
            late_count = outstanding
            refused_now = list(refused)
            unknown_now = list(unknown)
        if not refused_now and not unknown_now and late_count == 0:
            identities = {}
            for key, message in last_message.items():
                first = first_message[key]
                ends = (message,) if first.offset() == message.offset() else (first, message)
                identities[key] = tuple(
                    RecordIdentity.of(m.offset() or 0, m.key(), m.value(), m.timestamp()[1]) for m in ends
                )
            return last, identities
        uncertain = len(unknown_now) + late_count
        acknowledged = len(records) - len(refused_now) - not_queued - uncertain
        if acknowledged == 0 and uncertain == 0:
            raise refused_now[0]  # nothing was appended: the typed error of the first record
        cause = str((unknown_now or refused_now)[0]) if unknown_now or refused_now else ""
        if late_count:
            late = f"{late_count} not acknowledged within {timeout_s:.1f} s"
            cause = f"{late}; {cause}" if cause else late
        raise AppendOutcomeUnknownError(
            f"the append of {len(records)} record(s) did not complete: {acknowledged} acknowledged "
            f"by the leader (acks=1, not known to be replicated), "
            f"{len(refused_now) + not_queued} not appended, {uncertain} may or may not have been "
            f"appended (no answer came; none was resent, so none is in the log twice); resending the "
            f"request may duplicate "
            f"{acknowledged + uncertain} record(s) ({cause})",
            acknowledged=acknowledged,
            refused=len(refused_now) + not_queued,
            unknown=uncertain,
        )

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(timeout_s)


class RecordReader:
    """Reads offset ranges of partitions with one consumer (assign, consume, no group commits).

    Reads are serialised on the one consumer, and a read of records the broker does not deliver
    (it stopped answering: SIGSTOP, a hung disk) waits its whole ``timeout_s``. So a read that
    *stalled* (ended by its deadline short of its range, which lies below the high watermark and
    exists) is remembered per partition: for the next ``timeout_s`` a read of that partition
    returns what it has at once (nothing) instead of waiting again. Without it, N long polls on
    a stalled partition waited N timeouts one after another (8 polls: answered after 10-22 s
    where their bound is max wait + request timeout + *one* read, tests/service/test_answer_bounds.py
    in push mode). A read that completes clears the mark.
    """

    def __init__(
        self, settings: KafkaSettings | None = None, *, bootstrap_servers: str | None = None
    ) -> None:
        self._settings = settings or KafkaSettings()
        self._bootstrap = bootstrap_servers
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self.reads = 0
        self.stalled_reads = 0  # reads that ended by their deadline short of their range
        self.skipped_reads = 0  # reads answered at once because the partition had just stalled
        # partition -> until when its reads answer at once (its stalled read's end + timeout)
        self._stalled: dict[TopicPartitionKey, float] = {}

    def consumer_config(self) -> dict[str, str | int | float | bool]:
        """The configuration of the reader's consumer (built on the first read)."""
        return {
            **client_config(self._settings, self._bootstrap),
            # A group id is required by the client, but nothing is ever committed under it.
            "group.id": f"purgatory-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": READ_WAIT_MS,
            "log_level": "0",
        }

    def _get(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.consumer_config())
        return self._consumer

    def read(
        self,
        key: TopicPartitionKey,
        start: int,
        end: int,
        *,
        max_bytes: int,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> list[FetchedRecord]:
        """Records with offsets in ``[start, end)``, stopping after ``max_bytes`` (at least one record)."""
        if start < 0:
            raise InvalidOffsetError(f"fetch offset {start} of {key.label} is negative")
        if end <= start:
            return []
        # A key event's answers finished so far leave now, not after this read (up to timeout_s
        # on a stalled broker): see purgatory/_loop_handoff.py, "Bursts".
        release_burst()
        with self._lock:
            stalled_until = self._stalled.get(key)
            if stalled_until is not None and time.monotonic() < stalled_until:
                self.skipped_reads += 1
                return []  # it stalled a moment ago (perhaps while this read waited for the lock)
            consumer = self._get()
            self.reads += 1
            consumer.assign([TopicPartition(key.topic, key.partition, start)])
            try:
                out, complete = _consume_range(consumer, key, start, end, max_bytes, timeout_s)
            finally:
                consumer.unassign()
            if complete:
                self._stalled.pop(key, None)
            else:
                # The deadline passed short of the range: the broker did not deliver records
                # that exist. Reads of this partition answer at once for the next timeout_s.
                self.stalled_reads += 1
                self._stalled[key] = time.monotonic() + timeout_s
            return out

    def close(self) -> None:
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def _high_watermark_below(consumer: Consumer, key: TopicPartitionKey, end: int) -> bool:
    """True if the high watermark of the last fetch response (librdkafka's cache) is below ``end``."""
    _, high = consumer.get_watermark_offsets(TopicPartition(key.topic, key.partition), cached=True)
    return 0 <= high < end  # negative: not known, nothing to say it lags


def _consume_range(
    consumer: Consumer, key: TopicPartitionKey, start: int, end: int, max_bytes: int, timeout_s: float
) -> tuple[list[FetchedRecord], bool]:
    """Records of ``[start, end)`` from the assigned ``consumer`` within ``timeout_s``, and whether
    the read ended on its own terms (range, ``max_bytes`` or end of log) rather than by the deadline.

    An end of log reported by a broker whose high watermark is *below* ``end`` does not end a read
    of a range known to exist (``end`` a high watermark the caller saw): right after a leader
    change the new leader's high watermark can lag the one the old leader reported (it advances
    on its followers' next fetches), and its "end of log" would answer a long poll empty while
    its records exist. The read goes on fetching until the records come or its deadline. An end
    of log with the broker's high watermark at ``end`` (the rest is transaction markers or an
    open transaction, invisible to this read_committed consumer) and a read to :data:`LOG_END`
    end there. Either way the broker answered, so the read is not a stalled one.
    Pinned by test_an_end_of_log_below_the_known_high_watermark_does_not_end_the_read.
    """
    out: list[FetchedRecord] = []
    size = 0
    deadline = time.monotonic() + timeout_s
    answered_short = False  # an end of log below ``end`` was seen: the broker answers
    while time.monotonic() < deadline:
        # consume() returns after num_messages or the timeout: ask for no more than remain.
        expected = (out[-1].offset + 1) if out else start
        wanted = min(READ_BATCH, max(1, end - expected))
        messages = consumer.consume(
            wanted, timeout=max(0.0, min(CONSUME_SLICE_S, deadline - time.monotonic()))
        )
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if end >= LOG_END or not _high_watermark_below(consumer, key, end):
                        return out, True  # the range's end (what is short of it is not for consumers)
                    answered_short = True
                    continue
                raise _typed(error, key.label)
            offset = message.offset() or 0
            if offset >= end:
                return out, True
            record = FetchedRecord(offset, message.key(), message.value(), message.timestamp()[1])
            if out and size + record.size > max_bytes:
                return out, True
            out.append(record)
            size += record.size
            if offset >= end - 1:
                return out, True
    return out, answered_short
