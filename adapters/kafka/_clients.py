"""Thin, lazy, typed wrappers over confluent-kafka's Producer and Consumer for the operations.

:class:`RecordProducer` appends records with ``acks=1`` (the leader's append, as a Kafka producer
request that a ``DelayedProduce`` then holds until replication) and returns the offsets.
:class:`RecordReader` reads ``[start, end)`` of a partition for ``DelayedFetch``.

Both create their client on first use (no network in ``__init__``) and translate librdkafka
errors to the adapter's typed errors. Concurrency: thread-safe; the reader serialises reads on
one consumer with a lock (a fetch response is assembled on the thread that completes it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from purgatory.settings import KafkaSettings

from ._config import client_config
from ._errors import (
    InvalidOffsetError,
    InvalidTopicError,
    KafkaAdapterError,
    KafkaUnavailableError,
    RecordTooLargeError,
    UnknownTopicError,
)
from ._keys import TopicPartitionKey

__all__ = ["READ_TIMEOUT_S", "FetchedRecord", "ProducerRecord", "RecordProducer", "RecordReader"]

READ_BATCH = 500  # messages per consume() call: amortises the call without holding much memory
READ_WAIT_MS = "10"  # broker-side fetch wait: data is known to be there, do not idle 500 ms
READ_TIMEOUT_S = 2.0  # one read of a range known to exist; part of a long poll's answer bound


@dataclass(frozen=True, slots=True)
class ProducerRecord:
    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int

    @property
    def size(self) -> int:
        """Bytes of key and value (what ``min_bytes`` counts)."""
        return len(self.key or b"") + len(self.value or b"")


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
    if code in (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
    ):
        return KafkaUnavailableError(f"{what}: Kafka did not answer ({error.str()})")
    return KafkaAdapterError(f"{what}: {error.str()}")


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
                config: dict[str, str | int | float | bool] = {
                    **client_config(self._settings, self._bootstrap),
                    # acks=1: the leader's append answers the produce; DelayedProduce waits for the rest.
                    "acks": "1",
                    "linger.ms": "0",
                    # Idempotence would keep order and drop retried duplicates, but librdkafka (like
                    # the Java client) allows it only with acks=all. So: one request in flight per
                    # broker connection, and a retried batch is sent again before any later one —
                    # the records of a request keep their order through retries (with several in
                    # flight, a failed batch retried after a later one succeeded lands behind it).
                    "enable.idempotence": False,
                    "max.in.flight.requests.per.connection": 1,
                    "log_level": "0",
                    "socket.nagle.disable": True,  # latency over packet count: one record per produce
                    # librdkafka gives up on a record (and stops retrying it) when the append's
                    # bound has passed: a record reported as failed must not land later, behind
                    # the records of the next request (or of the client's retry of this one).
                    "message.timeout.ms": self._settings.append_timeout_ms,
                }
                self._producer = Producer(config)
            return self._producer

    def produce(
        self, records: Iterable[ProducerRecord], timeout_s: float = 10.0
    ) -> dict[TopicPartitionKey, int]:
        """Append ``records``; return the last offset appended per partition.

        Raises the typed error of the first record that failed (unknown topic, unavailable).
        """
        producer = self.producer
        last: dict[TopicPartitionKey, int] = {}
        errors: list[KafkaAdapterError] = []
        outstanding = 0

        def delivered(error: KafkaError | None, message: Message) -> None:
            nonlocal outstanding
            outstanding -= 1
            if error is not None:
                errors.append(_typed(error, f"topic {message.topic()!r}"))
                return
            key = TopicPartitionKey(message.topic() or "", message.partition() or 0)
            offset = message.offset() or 0
            last[key] = max(offset, last.get(key, -1))

        for record in records:
            try:
                if record.partition is None:
                    producer.produce(record.topic, value=record.value, key=record.key, on_delivery=delivered)
                else:
                    producer.produce(
                        record.topic, record.value, record.key, record.partition, on_delivery=delivered
                    )
            except KafkaException as exc:  # refused before queueing (too large, bad partition): typed
                raise _typed(exc.args[0], f"topic {record.topic!r}") from None
            outstanding += 1
        deadline = time.monotonic() + timeout_s
        while outstanding > 0 and time.monotonic() < deadline:
            producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
        if errors:
            raise errors[0]
        if outstanding > 0:
            raise KafkaUnavailableError(f"{outstanding} record(s) not acknowledged within {timeout_s:.1f} s")
        return last

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(timeout_s)


class RecordReader:
    """Reads offset ranges of partitions with one consumer (assign, consume, no group commits)."""

    def __init__(
        self, settings: KafkaSettings | None = None, *, bootstrap_servers: str | None = None
    ) -> None:
        self._settings = settings or KafkaSettings()
        self._bootstrap = bootstrap_servers
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self.reads = 0

    def _get(self) -> Consumer:
        if self._consumer is None:
            config: dict[str, str | int | float | bool] = {
                **client_config(self._settings, self._bootstrap),
                # A group id is required by the client, but nothing is ever committed under it.
                "group.id": f"purgatory-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": READ_WAIT_MS,
                "log_level": "0",
            }
            self._consumer = Consumer(config)
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
        out: list[FetchedRecord] = []
        size = 0
        with self._lock:
            consumer = self._get()
            self.reads += 1
            consumer.assign([TopicPartition(key.topic, key.partition, start)])
            try:
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    # consume() returns after num_messages or the timeout: ask for no more than remain.
                    expected = (out[-1].offset + 1) if out else start
                    wanted = min(READ_BATCH, max(1, end - expected))
                    messages = consumer.consume(wanted, timeout=max(0.0, deadline - time.monotonic()))
                    for message in messages:
                        error = message.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                return out
                            raise _typed(error, key.label)
                        offset = message.offset() or 0
                        if offset >= end:
                            return out
                        ts = message.timestamp()[1]
                        record = FetchedRecord(offset, message.key(), message.value(), ts)
                        if out and size + record.size > max_bytes:
                            return out
                        out.append(record)
                        size += record.size
                        if offset >= end - 1:
                            return out
                return out
            finally:
                consumer.unassign()

    def close(self) -> None:
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
