"""KafkaJournalSink: the operation journal on a Kafka topic.

Each event is one record: key = the operation id, value = the event's JSON line. Keying by
operation puts an operation's ``created`` and finish events on one partition, and the idempotent
producer (``enable.idempotence=true``, which implies ``acks=all`` and ordered retries) keeps them
in order there. A retry after a lost acknowledgement may still write a record twice across
producer restarts; events carry deterministic ids, and the Spark job removes duplicates by id.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from purgatory.journal import FileJournalSink, Journal, JournalEvent, JournalSink
from purgatory.settings import Settings

from ._config import client_config, redacted

__all__ = ["KafkaJournalSink", "build_journal", "ensure_journal_topic"]

_log = structlog.get_logger("purgatory.journal.kafka")

# Overridable by the caller's config; these are the journal's guarantees, not tuning.
PRODUCER_DEFAULTS = {
    "enable.idempotence": "true",  # no duplicates or reordering from the producer's own retries
    "acks": "all",  # an event counts as written once every in-sync replica has it
    "linger.ms": "20",  # batch events for 20 ms: the journal is throughput, not latency
    "compression.type": "lz4",  # JSON lines compress ~5x; lz4 costs little CPU
}
GUARANTEES = ("enable.idempotence", "acks")  # refused if the caller weakens them
BUFFER_FULL_WAIT_S = 0.05  # librdkafka's local queue is full: serve callbacks this long, retry
FLUSH_TIMEOUT_S = 30.0  # flush()/close() wait at most this long for acknowledgements
TOPIC_TIMEOUT_S = 30.0  # topic creation is a metadata round trip plus the controller's work


class KafkaJournalSink:
    """Writes journal events to ``topic`` with an idempotent producer (see the module docstring).

    The producer is created on the first write, not in ``__init__`` (no network at construction).
    ``write`` hands records to librdkafka and returns; delivery reports arrive on later
    ``write``/``flush`` calls and are counted: ``delivered`` and ``delivery_errors`` (each failed
    record logged with its error, never its content). ``flush`` waits, bounded, for every
    outstanding acknowledgement and raises :class:`KafkaException` naming how many are missing.

    Concurrency contract: the journal's writer thread is the only caller (see ``JournalSink``).
    """

    def __init__(
        self,
        config: Mapping[str, str],
        topic: str,
        *,
        flush_timeout_s: float = FLUSH_TIMEOUT_S,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        if not topic:
            raise ValueError("topic must be a non-empty topic name")
        for name in GUARANTEES:
            if name in config and str(config[name]).lower() != PRODUCER_DEFAULTS[name]:
                raise ValueError(
                    f"{name} = {config[name]!r}: the journal needs {PRODUCER_DEFAULTS[name]!r} "
                    "(ordered, non-duplicated events per operation)"
                )
        self.topic = topic
        self._config: dict[str, Any] = {**PRODUCER_DEFAULTS, **config}
        self._flush_timeout_s = flush_timeout_s
        self._producer_factory = producer_factory
        self._producer: Producer | None = None
        self.delivered = 0
        self.delivery_errors = 0

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._producer = self._producer_factory(self._config)
            _log.info("journal_producer_started", topic=self.topic, config=redacted(self._config))
        return self._producer

    def write(self, events: Sequence[JournalEvent]) -> None:
        producer = self._ensure_producer()
        deadline = time.monotonic() + self._flush_timeout_s
        for event in events:
            while True:
                try:
                    producer.produce(
                        self.topic, key=event.op_id, value=event.to_json(), on_delivery=self._on_delivery
                    )
                    break
                except BufferError:
                    # librdkafka's queue is full: serve delivery reports to make room, bounded.
                    if time.monotonic() > deadline:
                        raise
                    producer.poll(BUFFER_FULL_WAIT_S)
        producer.poll(0)  # serve delivery reports without waiting

    def flush(self) -> None:
        if self._producer is None:
            return
        remaining = self._producer.flush(self._flush_timeout_s)
        if remaining:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"{remaining} journal events to {self.topic!r} not acknowledged "
                    f"within {self._flush_timeout_s} s",
                )
            )

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer = None

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.delivery_errors += 1
            _log.error("journal_delivery_failed", topic=self.topic, error=str(error), key=message.key())

    def __repr__(self) -> str:
        return f"KafkaJournalSink(topic={self.topic!r})"


def ensure_journal_topic(
    config: Mapping[str, str], topic: str, *, partitions: int = 3, replication_factor: int = 1
) -> bool:
    """Create ``topic`` unless it exists; True if this call created it."""
    admin = AdminClient(dict(config))
    if topic in admin.list_topics(timeout=TOPIC_TIMEOUT_S).topics:
        return False
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)],
        request_timeout=TOPIC_TIMEOUT_S,
    )
    try:
        futures[topic].result(TOPIC_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False  # created concurrently by someone else: fine
        raise
    return True


def build_journal(settings: Settings, bootstrap_servers: str | None = None) -> Journal | None:
    """The journal the settings describe (``journal.*``), or None when it is disabled."""
    js = settings.journal
    if not js.enabled:
        return None
    sinks: list[JournalSink] = []
    if "file" in js.sinks:
        sinks.append(FileJournalSink(js.directory, max_bytes=js.max_file_bytes, max_files=js.max_files))
    if "kafka" in js.sinks:
        sinks.append(KafkaJournalSink(client_config(settings.kafka, bootstrap_servers), js.topic))
    return Journal(
        sinks,
        capacity=js.queue_capacity,
        batch_size=js.batch_size,
        flush_interval_s=js.flush_interval_ms / 1000.0,
    )
