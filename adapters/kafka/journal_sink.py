"""KafkaJournalSink: the operation journal on a Kafka topic.

Each event is one record: key = the operation id, value = the event's JSON line. Keying by
operation puts an operation's ``created`` and finish events on one partition, and the idempotent
producer (``enable.idempotence=true``, which implies ``acks=all`` and ordered retries) keeps them
in order there. A retry after a lost acknowledgement may still write a record twice across
producer restarts; events carry deterministic ids, and the Spark job removes duplicates by id.

Loud failures: :meth:`KafkaJournalSink.prepare` (called by ``Journal.attach``) checks that the
topic exists — creating it when asked (``journal.create_topic``) — and raises
:class:`JournalTopicError` otherwise, so a service with a misconfigured journal fails at start
instead of failing every event. An event counts as written only once Kafka acknowledged it
(``delivery_counts``); delivery errors are logged at most once per ``DELIVERY_ERROR_LOG_INTERVAL_S``
with the number of failures in between.
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

from .clients._config import client_config, redacted
from .clients._errors import KafkaAdapterError, KafkaUnavailableError

__all__ = ["JournalTopicError", "KafkaJournalSink", "build_journal", "ensure_journal_topic"]

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
# A missing topic or a dead cluster fails every event: one line per event would flood the log
# (thousands per second) and hide everything else. One line per interval carries the count.
DELIVERY_ERROR_LOG_INTERVAL_S = 10.0
JOURNAL_TOPIC_PARTITIONS = 3  # created topics: a few partitions so Spark reads in parallel


class JournalTopicError(KafkaAdapterError):
    """The journal's topic does not exist (and the sink was not asked to create it)."""


class _RateLimitedErrors:
    """Logs the first delivery error at once, then at most one line per interval with a count.

    Writer-thread only (delivery callbacks run inside the sink's ``poll``/``flush``).
    """

    def __init__(self, topic: str, interval_s: float, clock: Callable[[], float]) -> None:
        self._topic = topic
        self._interval_s = interval_s
        self._clock = clock
        self._next_log_at = float("-inf")
        self._suppressed = 0

    def error(self, error: str, key: object) -> None:
        now = self._clock()
        if now < self._next_log_at:
            self._suppressed += 1
            return
        _log.error(
            "journal_delivery_failed",
            topic=self._topic,
            error=error,
            key=key,
            failed_since_last_report=self._suppressed,
        )
        self._suppressed = 0
        self._next_log_at = now + self._interval_s


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
        create_topic: bool = False,
        admin_factory: Callable[[dict[str, Any]], AdminClient] = AdminClient,
        error_log_interval_s: float = DELIVERY_ERROR_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
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
        self._create_topic = create_topic
        self._admin_factory = admin_factory
        self._errors = _RateLimitedErrors(topic, error_log_interval_s, clock)
        self.delivered = 0
        self.delivery_errors = 0

    def prepare(self) -> None:
        """Check that the topic exists (create it when ``create_topic``); raise if it cannot be used.

        Raises :class:`JournalTopicError` for a missing topic, :class:`KafkaUnavailableError`
        when the cluster does not answer within ``TOPIC_TIMEOUT_S``.
        """
        config = {k: v for k, v in self._config.items() if k not in PRODUCER_DEFAULTS}
        admin = self._admin_factory(config)
        try:
            # All topics, not list_topics(topic): naming one in a metadata request lets a broker
            # with auto.create.topics.enable create it behind our back.
            metadata = admin.list_topics(timeout=TOPIC_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaUnavailableError(
                f"journal sink: Kafka did not answer whether topic {self.topic!r} exists: {exc}"
            ) from None
        found = metadata.topics.get(self.topic)
        if found is not None and found.error is None:
            return
        if not self._create_topic:
            raise JournalTopicError(
                f"journal topic {self.topic!r} does not exist: create it, or set "
                "journal.create_topic = true (PURGATORY_JOURNAL__CREATE_TOPIC=true) to create it at start"
            )
        created = ensure_journal_topic(config, self.topic, partitions=JOURNAL_TOPIC_PARTITIONS)
        _log.info("journal_topic_created" if created else "journal_topic_exists", topic=self.topic)

    def delivery_counts(self) -> tuple[int, int]:
        """(events Kafka acknowledged, events whose delivery failed): what the journal counts."""
        return self.delivered, self.delivery_errors

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
            self._errors.error(str(error), message.key())

    def __repr__(self) -> str:
        return f"KafkaJournalSink(topic={self.topic!r})"


def ensure_journal_topic(
    config: Mapping[str, Any],
    topic: str,
    *,
    partitions: int = JOURNAL_TOPIC_PARTITIONS,
    replication_factor: int = -1,  # the broker's default.replication.factor
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
        config = client_config(settings.kafka, bootstrap_servers)
        sinks.append(KafkaJournalSink(config, js.topic, create_topic=js.create_topic))
    return Journal(
        sinks,
        capacity=js.queue_capacity,
        batch_size=js.batch_size,
        flush_interval_s=js.flush_interval_ms / 1000.0,
    )
