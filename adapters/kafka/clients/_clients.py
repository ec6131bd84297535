"""Thin, lazy, typed wrappers over confluent-kafka's Producer and Consumer for the operations.

:class:`ProducerRecord` is a checked record to produce (``KafkaPurgatory.produce`` sends it
through the idempotent producer, ``_sender.RecordSender``). :class:`RecordReader` reads
``[start, end)`` of a partition for ``DelayedFetch``.

The reader creates its client on first use (no network in ``__init__``) and translate librdkafka
errors to the adapter's typed errors. Concurrency: thread-safe; the reader serialises reads on
one consumer with a lock (a fetch response is assembled on the thread that completes it).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from purgatory._loop_handoff import release_burst

from ..facts._keys import TopicPartitionKey, _check_partition, _check_topic
from ..settings import KafkaSettings
from ._config import client_config
from ._errors import (
    InvalidOffsetError,
    InvalidTopicError,
    KafkaAdapterError,
    KafkaUnavailableError,
    RecordTooLargeError,
    UnknownTopicError,
)

__all__ = [
    "DIGEST_BYTES",
    "LOG_END",
    "READ_TIMEOUT_S",
    "FetchedRecord",
    "ProducerRecord",
    "RecordIdentity",
    "RecordReader",
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
        for name, field_value in (("value", self.value), ("key", self.key)):
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


def _typed(error: KafkaError, what: str, *, topic: str | None = None) -> KafkaAdapterError:
    """``error`` as the adapter's typed error; ``what`` prefixes the message (``topic``, when
    given, names the topic of an unknown-topic error)."""
    code = error.code()
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION):
        return UnknownTopicError(what if topic is None else topic, detail=error.str())
    if code == KafkaError.OFFSET_OUT_OF_RANGE:
        return InvalidOffsetError(f"{what}: offset out of range ({error.str()})")
    if code == KafkaError.TOPIC_EXCEPTION:
        return InvalidTopicError(f"{what}: Kafka refused the topic name ({error.str()})")
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return RecordTooLargeError(f"{what}: record too large ({error.str()})")
    if code in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE):
        # Reported only once the producer's retries gave up: the caller may retry.
        return KafkaUnavailableError(f"{what}: the partition's leadership is moving, retry ({error.str()})")
    if code == KafkaError._PURGE_QUEUE:
        return KafkaUnavailableError(
            f"{what}: not sent: withdrawn from the producer's queue; retrying it is safe"
        )
    if code in (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
    ):
        return KafkaUnavailableError(f"{what}: Kafka did not answer ({error.str()})")
    return KafkaAdapterError(f"{what}: {error.str()}")


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
            deadline = time.monotonic() + timeout_s  # one read's bound, the end's query included
            if end >= LOG_END:
                end = _log_end(consumer, key, timeout_s)
                if end <= start:
                    return []  # nothing past start: answered by one ListOffsets
            consumer.assign([TopicPartition(key.topic, key.partition, start)])
            try:
                left_s = max(0.0, deadline - time.monotonic())
                out, complete = _consume_range(consumer, key, start, end, max_bytes, left_s)
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


def _log_end(consumer: Consumer, key: TopicPartitionKey, timeout_s: float) -> int:
    """The partition's high watermark now (one ListOffsets to its leader), or :data:`LOG_END`
    when the leader does not say (the read then runs to its end of log, as before).

    A read "to the log's end" (a fetch that does not wait) that consumes until its end-of-log
    event waited a whole consume slice (20 ms) for it: librdkafka's consume returns after its
    count or its timeout, and an end of log is one event. With the end known, a read at the end
    costs one round trip, and a read of records ends at its last one.
    """
    try:
        _low, high = consumer.get_watermark_offsets(
            TopicPartition(key.topic, key.partition), timeout=timeout_s, cached=False
        )
    except KafkaException:
        return LOG_END
    return int(high) if high is not None and high >= 0 else LOG_END


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
