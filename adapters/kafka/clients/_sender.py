"""RecordSender: an idempotent producer whose delivery reports are served by a thread of its own.

Requests and replies are sent with ``enable.idempotence`` (``acks=all``): a record retried after a
lost acknowledgement is written once, in order. That is the producer side of "at least once,
duplicates removed": what can still repeat — a responder answering a redelivered request — the
requester's purgatory removes (each request finishes once).

``send`` never blocks on Kafka: it queues the record (librdkafka batches and sends it after
``linger_ms``) and returns; the delivery report arrives on the ``kafka-sender-<name>`` thread,
which does nothing but ``poll``. Callers waiting for a reply do not wait for the
acknowledgement of their request: the reply is the acknowledgement that matters.

**The in-flight window** (:class:`InFlightWindow`). librdkafka's idempotent producer lets at most
5 *messages* (``RD_KAFKA_IDEMP_MAX_INFLIGHT``, counted in messages, not requests:
``rktp_msgs_inflight``) be unacknowledged per partition, and while that window is full and a
batch is ready (its ``linger.ms`` passed) its broker thread does not sleep: it sets its next
wake-up to "now" and polls its socket without waiting until an acknowledgement comes back
(librdkafka 2.16.0, ``rd_kafka_toppar_producer_serve``; upstream PR confluentinc/librdkafka#4989
is about the same count). At 1,000 records/s the window is full whenever the produce round trip
exceeds ~5 ms — every round trip with 3 brokers and ``acks=all`` — so the thread spun through
most of each round trip: a standalone producer at 1,000 records/s on 3 local brokers woke 150-410
times and spent 157-320 µs of CPU per record, and the CPU it burnt made the brokers (on the
same cores) slower to acknowledge, which kept the window full. The sender therefore hands
librdkafka a record only while fewer than ``IDEMPOTENCE_WINDOW`` of its records to that
partition are unreported, and holds the rest; every delivery report releases what was held
(in order, one batch), so librdkafka never holds a ready batch behind a full window. Same
records, same order, same idempotence and batching (the held records leave in one produce
request, as librdkafka would have batched them after the acknowledgement): 45-56 µs per record
and 0.3-0.4 wake-ups in the same test. The price: a delivery report per record (the sender
thread serves them; a Python call each). A held record counts towards its delivery deadline
from ``send``: one still held when ``message.timeout.ms`` has passed is reported failed
(unavailable) without being produced, so it is answered within at most twice that bound.

Concurrency contract: ``send``, ``flush`` and ``stats`` from any thread; ``close`` once, by the
owner (it flushes, then stops the thread). Delivery callbacks run on the sender thread: keep them
short (they finish operations, which is quick).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..settings import KafkaSettings
from ._clients import _typed
from ._config import client_config, redacted
from ._errors import KafkaAdapterError, KafkaUnavailableError

__all__ = [
    "IDEMPOTENCE_WINDOW",
    "DeliveryCallback",
    "InFlightWindow",
    "RecordSender",
    "SenderStats",
    "produce_one",
]

_log = structlog.get_logger("purgatory.kafka.sender")

POLL_S = 0.05  # the sender thread's poll: how late a stop is noticed (reports wake it at once)
CLOSE_FLUSH_S = 5.0
# A request or reply waits up to this long for others to share its produce request. At 1,000
# round trips/s on one broker (purgatory bench request-reply, shared 2-core machine) linger 0 cost
# ~500 us of requester and ~600 us of broker CPU per round trip, linger 2 ~330 / ~450, linger 5
# ~220 / ~300 with p50 +8 ms: on a busy machine the CPU saved is latency saved. 2 ms: p50 ~6 ms.
DEFAULT_LINGER_MS = 2

# librdkafka's idempotent producer: at most this many unacknowledged *messages* per partition
# (RD_KAFKA_IDEMP_MAX_INFLIGHT); module doc, "The in-flight window".
IDEMPOTENCE_WINDOW = 5

# ``message`` is None for a record that never reached librdkafka (held, then refused or timed out).
DeliveryCallback = Callable[[KafkaAdapterError | None, Message | None], None]


@dataclass
class SenderStats:
    sent: int = 0
    failed: int = 0  # reported undelivered
    held: int = 0  # records held back while their partition's window was full (module doc)


ANY_PARTITION = -1  # librdkafka's RD_KAFKA_PARTITION_UA: its partitioner picks the partition


def produce_one(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    partition: int | None,
    headers: Sequence[tuple[str, str | bytes | None]],
    on_delivery: Callable[[KafkaError | None, Message], None],
) -> None:
    """Queue one record on ``producer``; raises the adapter's typed error when librdkafka refuses
    it at once (nothing was queued): queue full (unavailable), too large or an unknown partition
    (typed as the delivery errors are), a value or header of the wrong type."""
    try:
        producer.produce(
            topic,
            value,
            key,
            ANY_PARTITION if partition is None else partition,
            headers=list(headers) if headers else None,
            on_delivery=on_delivery,
        )
    except BufferError:
        raise KafkaUnavailableError(
            f"topic {topic!r}: the producer's queue is full (Kafka is not keeping up)"
        ) from None
    except KafkaException as exc:
        # Typed (too large, unknown partition...): a produce turns it into the record's status.
        raise _typed(exc.args[0], f"topic {topic!r}: record refused", topic=topic) from None
    except (TypeError, ValueError) as exc:
        # confluent_kafka checks the value's and headers' types only here: for a held record
        # that is at its release, on the sender thread, where only a typed refusal is reported.
        # Pinned by test_a_held_record_the_client_refuses_as_malformed_is_reported_typed_...
        raise KafkaAdapterError(f"topic {topic!r}: record refused ({exc})") from None


@dataclass(slots=True)
class HeldRecord:
    """A record for a window: where it goes, what it is, whom to tell, and when ``send`` got it."""

    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None  # None: librdkafka's partitioner picks
    headers: list[tuple[str, str | bytes | None]]
    report: DeliveryCallback  # the typed outcome (counts failures, then the caller's callback)
    since: float  # time.monotonic() at send


@dataclass(slots=True)
class _Lane:
    """One destination's window: records handed to librdkafka and not reported, records held."""

    unreported: int = 0
    held: collections.deque[HeldRecord] = field(default_factory=collections.deque)


class InFlightWindow:
    """Which records go to librdkafka now and which wait (module doc, "The in-flight window").

    A *lane* is a destination: ``(topic, partition)``, or ``(topic, None)`` for records whose
    partition librdkafka's partitioner picks (their window is shared across the topic's
    partitions: it is never larger than one partition's). ``admit`` says whether a new record
    may be produced now (nothing held before it in its lane, fewer than ``size`` unreported);
    ``reported`` counts one report and returns the held records to produce now — all of them,
    in order, once the lane is below ``size`` again.

    Concurrency contract: not thread-safe; :class:`RecordSender` calls it under its lock (and
    produces what it returns under that lock too, so records of a lane keep their order).
    """

    __slots__ = ("_lanes", "size")

    def __init__(self, size: int = IDEMPOTENCE_WINDOW) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size!r}")
        self.size = size
        self._lanes: dict[tuple[str, int | None], _Lane] = {}

    def admit(self, record: HeldRecord) -> bool:
        """True: produce ``record`` now (counted unreported). False: it is held."""
        lane_key = (record.topic, record.partition)
        lane = self._lanes.get(lane_key)
        if lane is None:
            lane = self._lanes[lane_key] = _Lane()
        if lane.held or lane.unreported >= self.size:
            lane.held.append(record)
            return False
        lane.unreported += 1
        return True

    def reported(self, topic: str, partition: int | None) -> list[HeldRecord]:
        """One record of lane ``(topic, partition)`` was reported; the held records now due."""
        lane = self._lanes.get((topic, partition))
        if lane is None:
            return []
        lane.unreported -= 1
        if lane.unreported >= self.size or not lane.held:
            if lane.unreported <= 0 and not lane.held:
                del self._lanes[(topic, partition)]  # no empty lane per partition ever named
            return []
        due = list(lane.held)
        lane.held.clear()
        lane.unreported += len(due)
        return due

    def held(self) -> int:
        """Records held in every lane."""
        return sum(len(lane.held) for lane in self._lanes.values())


class RecordSender:
    """Queues records on an idempotent producer; reports deliveries on its own thread (module doc)."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        bootstrap_servers: str | None = None,
        name: str = "kafka",
        linger_ms: int = DEFAULT_LINGER_MS,
        message_timeout_ms: int | None = None,
    ) -> None:
        # A record not delivered within message_timeout_ms (default kafka.append_timeout_ms) is
        # reported failed and never lands later; until then the producer retries it.
        timeout_ms = settings.append_timeout_ms if message_timeout_ms is None else message_timeout_ms
        self._config: dict[str, str | int | float | bool] = {
            **client_config(settings, bootstrap_servers),
            "enable.idempotence": True,  # acks=all, retries without duplicates or reordering
            "linger.ms": linger_ms,
            # Every record is reported: the in-flight window moves on reports (module doc). (It
            # used to report failures only, unless the owner needed the acknowledgements: a
            # report per record wakes this thread; the window's saving is far larger.)
            "delivery.report.only.error": False,
            "socket.nagle.disable": True,  # small records, latency first
            # A record not delivered by the deadline of an append is reported failed (and never
            # lands later): the request it belongs to is failed with that error.
            "message.timeout.ms": timeout_ms,
            "log_level": 0,
        }
        self.name = name
        self.stats = SenderStats()
        self._message_timeout_s = timeout_ms / 1000.0
        # Guards the window and the producer calls it orders; taken on the caller's thread
        # (send) and the sender thread (reports). librdkafka never calls back into Python from
        # produce(), so holding it across produce() cannot deadlock.
        self._window_lock = threading.Lock()
        self._window = InFlightWindow()
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _get(self) -> Producer:
        producer = self._producer  # once built it stays until close(): no lock per record
        if producer is not None:
            return producer
        with self._lock:
            if self._producer is None:
                _log.debug("kafka_sender_connect", sender=self.name, config=redacted(self._config))
                self._producer = Producer(self._config)
                self._thread = threading.Thread(
                    target=self._run, args=(self._producer,), name=f"kafka-sender-{self.name}", daemon=True
                )
                self._thread.start()
            return self._producer

    def producer(self) -> Producer:
        """The producer itself, for a caller that queues records with its own delivery callback
        (:func:`produce_one`), exactly in librdkafka's order and batching.

        Such records bypass the in-flight window, whose lanes are per destination: a record held
        behind a full partition lane could be overtaken by a later record of the same request
        whose partition the partitioner picks. So a sender is used either way, never both (the
        produce path has one of its own; request-reply's uses :meth:`send`). Delivery reports
        are served on this sender's thread; the caller counts ``stats.sent`` itself.
        """
        return self._get()

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Queue one record; ``on_delivery(error, message)`` runs on the sender thread.

        Raises a typed error when librdkafka refuses it at once (queue full, too large, unknown
        partition): nothing was queued then.
        """
        producer = self._get()

        def report(error: KafkaAdapterError | None, message: Message | None) -> None:
            if error is not None:
                self.stats.failed += 1
            if on_delivery is None:
                return
            try:
                on_delivery(error, message)
            except Exception:
                # One caller's raising callback must not keep the records reported with it
                # (released by the same delivery, failed in the same pass) from their reports.
                _log.exception("kafka_sender_report_failed", sender=self.name, topic=topic)

        record = HeldRecord(topic, value, key, partition, list(headers), report, time.monotonic())
        with self._window_lock:
            if not self._window.admit(record):
                self.stats.held += 1
                return
            try:
                self._produce(producer, record)
            except BaseException:
                self._window.reported(topic, partition)  # nothing was queued: not in flight
                raise
        self.stats.sent += 1

    def _produce(self, producer: Producer, record: HeldRecord) -> None:
        """Hand one admitted record to librdkafka (under the window lock); typed errors if refused."""
        topic, partition = record.topic, record.partition

        def delivered(error: KafkaError | None, message: Message) -> None:
            # On the sender thread (poll) or a flushing caller. The window moves first, so a
            # callback that sends again finds room in it.
            self._released(producer, topic, partition)
            # Typed as the append's errors are: unavailable (worth another try) or a refusal
            # that will repeat (unknown topic or partition, too large).
            record.report(
                None
                if error is None
                else _typed(error, f"topic {topic!r}: record not delivered", topic=topic),
                message,
            )

        produce_one(producer, topic, record.value, record.key, partition, record.headers, delivered)

    def _released(self, producer: Producer, topic: str, partition: int | None) -> None:
        """A record of lane (topic, partition) was reported: produce what the window now lets go.

        A held record older than the producer's ``message.timeout.ms`` is reported failed
        (unavailable) instead — librdkafka would have timed it out by now had it been queued
        there — and one librdkafka refuses is reported with that error; neither stays counted.
        """
        failed: list[tuple[HeldRecord, KafkaAdapterError]] = []
        with self._window_lock:
            due = self._window.reported(topic, partition)
            now = time.monotonic()
            for record in due:
                if now - record.since >= self._message_timeout_s:
                    failed.append(
                        (record, KafkaUnavailableError(f"topic {topic!r}: record not delivered in time"))
                    )
                    self._window.reported(topic, partition)
                    continue
                try:
                    self._produce(producer, record)
                except KafkaAdapterError as exc:
                    failed.append((record, exc))
                    self._window.reported(topic, partition)
                    continue
                self.stats.sent += 1
        for record, error in failed:  # outside the lock: a callback may send again
            record.report(error, None)

    def in_flight(self) -> int:
        """Records held, queued or sent and not yet acknowledged (or reported failed)."""
        with self._lock:
            producer = self._producer
        if producer is None:
            return 0
        with self._window_lock:
            held = self._window.held()
        return held + len(producer)

    def flush(self, timeout_s: float) -> int:
        """Wait until every record sent was reported (or ``timeout_s``); return how many remain.

        Held records are released by the reports this serves (librdkafka's flush serves
        delivery reports on the calling thread), so the loop flushes until none is left.
        """
        return self._drain(self._get(), timeout_s)

    def _drain(self, producer: Producer, timeout_s: float) -> int:
        """Flush ``producer`` until nothing is queued or held (or ``timeout_s``); how many remain."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = int(producer.flush(max(0.0, deadline - time.monotonic())))
            with self._window_lock:
                remaining += self._window.held()
            if remaining == 0 or time.monotonic() >= deadline:
                return remaining

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
        # Reports served by the flush release held records into the producer, which the drain
        # then waits for; what is still held at the end was never handed to Kafka.
        remaining = self._drain(producer, timeout_s)
        if remaining:
            _log.warning("kafka_sender_unflushed", sender=self.name, records=remaining)
        self._stopping.set()
        if thread is not None:
            thread.join(timeout_s)
