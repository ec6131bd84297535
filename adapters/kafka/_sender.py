"""RecordSender: an idempotent producer whose delivery reports are served by a thread of its own.

Requests and replies are sent with ``enable.idempotence`` (``acks=all``): a record retried after a
lost acknowledgement is written once, in order. That is the producer side of "at least once,
duplicates removed": what can still repeat — a responder answering a redelivered request — the
requester's purgatory removes (each request finishes once).

``send`` never blocks on Kafka: it queues the record (librdkafka batches and sends it after
``linger_ms``) and returns; the delivery report arrives on the ``kafka-sender-<name>`` thread,
which does nothing but ``poll``. Callers waiting for a reply do not wait for the
acknowledgement of their request: the reply is the acknowledgement that matters.

Concurrency contract: ``send``, ``flush`` and ``stats`` from any thread; ``close`` once, by the
owner (it flushes, then stops the thread). Delivery callbacks run on the sender thread: keep them
short (they finish operations, which is quick).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from purgatory.settings import KafkaSettings

from ._clients import _typed
from ._config import client_config, redacted
from ._errors import KafkaAdapterError, KafkaUnavailableError

__all__ = ["DeliveryCallback", "RecordSender", "SenderStats"]

_log = structlog.get_logger("purgatory.kafka.sender")

POLL_S = 0.05  # the sender thread's poll: how late a stop is noticed (reports wake it at once)
CLOSE_FLUSH_S = 5.0
# A request or reply waits up to this long for others to share its produce request. At 1,000
# round trips/s on one broker (purgatory bench request-reply, shared 2-core machine) linger 0 cost
# ~500 us of requester and ~600 us of broker CPU per round trip, linger 2 ~330 / ~450, linger 5
# ~220 / ~300 with p50 +8 ms: on a busy machine the CPU saved is latency saved. 2 ms: p50 ~6 ms.
DEFAULT_LINGER_MS = 2

DeliveryCallback = Callable[[KafkaAdapterError | None, Message], None]


@dataclass
class SenderStats:
    sent: int = 0
    failed: int = 0  # reported undelivered


class RecordSender:
    """Queues records on an idempotent producer; reports deliveries on its own thread (module doc)."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        bootstrap_servers: str | None = None,
        name: str = "kafka",
        linger_ms: int = DEFAULT_LINGER_MS,
        report_successes: bool = False,
    ) -> None:
        self._config: dict[str, str | int | float | bool] = {
            **client_config(settings, bootstrap_servers),
            "enable.idempotence": True,  # acks=all, retries without duplicates or reordering
            "linger.ms": linger_ms,
            # Only failures are reported unless the owner needs to know what Kafka acknowledged
            # (the responder commits behind it): a report per record woke this thread (and took
            # the GIL from the tail and the event loop) a thousand times a second for nothing.
            "delivery.report.only.error": not report_successes,
            "socket.nagle.disable": True,  # small records, latency first
            # A record not delivered by the deadline of an append is reported failed (and never
            # lands later): the request it belongs to is failed with that error.
            "message.timeout.ms": settings.append_timeout_ms,
            "log_level": 0,
        }
        self.name = name
        self.stats = SenderStats()
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _get(self) -> Producer:
        with self._lock:
            if self._producer is None:
                _log.debug("kafka_sender_connect", sender=self.name, config=redacted(self._config))
                self._producer = Producer(self._config)
                self._thread = threading.Thread(
                    target=self._run, args=(self._producer,), name=f"kafka-sender-{self.name}", daemon=True
                )
                self._thread.start()
            return self._producer

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Queue one record; ``on_delivery(error, message)`` runs on the sender thread.

        Raises a typed error when librdkafka refuses it at once (queue full, too large, unknown
        partition): nothing was queued then.
        """
        producer = self._get()

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is None:
                typed = None
            else:
                self.stats.failed += 1
                # Typed as the append's errors are: unavailable (worth another try) or a refusal
                # that will repeat (unknown topic or partition, too large).
                typed = _typed(error, f"topic {topic!r}: record not delivered")
            if on_delivery is not None:
                on_delivery(typed, message)

        try:
            if partition is None:
                producer.produce(topic, value, key, headers=list(headers), on_delivery=delivered)
            else:
                producer.produce(topic, value, key, partition, headers=list(headers), on_delivery=delivered)
        except BufferError:
            raise KafkaUnavailableError(
                f"topic {topic!r}: the producer's queue is full (Kafka is not keeping up)"
            ) from None
        except KafkaException as exc:
            raise KafkaAdapterError(f"topic {topic!r}: record refused ({exc.args[0].str()})") from None
        self.stats.sent += 1

    def in_flight(self) -> int:
        """Records queued or sent and not yet acknowledged (or reported failed)."""
        with self._lock:
            producer = self._producer
        return 0 if producer is None else len(producer)

    def flush(self, timeout_s: float) -> int:
        """Wait until every queued record was reported (or ``timeout_s``); return how many remain."""
        producer = self._get()
        return int(producer.flush(timeout_s))

    def _run(self, producer: Producer) -> None:
        while not self._stopping.is_set():
            try:
                producer.poll(POLL_S)
            except Exception:  # a raising delivery callback must not end delivery reports
                _log.exception("kafka_sender_poll_failed", sender=self.name)

    def close(self, timeout_s: float = CLOSE_FLUSH_S) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
            thread, self._thread = self._thread, None
        if producer is None:
            return
        remaining = producer.flush(timeout_s)
        if remaining:
            _log.warning("kafka_sender_unflushed", sender=self.name, records=remaining)
        self._stopping.set()
        if thread is not None:
            thread.join(timeout_s)
