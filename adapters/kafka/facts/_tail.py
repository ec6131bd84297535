"""PartitionTail: the change feed's push source — watched partitions tailed by one real consumer.

Kafka's broker wakes a fetch purgatory key when its log appends; a Python service next to Kafka
gets the same wake-up from the broker's own long poll: a :class:`confluent_kafka.Consumer`
fetching the watched partitions (``assign``, no group, nothing committed) is answered by the
broker as soon as records arrive — the broker's DelayedFetch is the timer here. Each fetch
response carries the partition's high watermark (``get_watermark_offsets(cached=True)``) and the
new records themselves.

Algorithm (one thread, ``kafka-tail-<name>``), each round:

1. If the set of partitions to follow changed (``follow``), ``incremental_assign`` the new ones
   at their end (only records appended from now on are tailed: a waiter behind the end is
   answered from the log by its own read) — or, with ``read_last=True`` (the change feed's
   tail), one record before it — and ``incremental_unassign`` the dropped ones. Why the feed
   reads the last record: the end is the high watermark when librdkafka resolves it, and a
   produce is watched right after its append; on a replicated topic the followers may already
   have fetched the record by then, so a tail started at the end sits *past* it and no fetch
   response ever carries it (records-less responses vouch for nothing, see below) — the
   produce waited for the refresh poll, ~``feed_refresh_ms`` (docs/performance.md). Reading the
   record below the end gives a push that vouches for that end, with the epoch proof of the
   record read: every record appended before the tail started is covered at once. The reply
   router's tail (records, not positions, are what it wants) starts at the end: an old reply
   read again would be counted as unknown.
2. ``poll(ROUND_S)`` then ``consume(TAIL_BATCH, 0)``: returns as soon as a fetch response
   brings records (the broker holds an idle fetch for ``fetch.wait.max.ms``), with the rest of
   what was fetched, or after ``ROUND_S`` with nothing.
3. For each partition with records: hand them to ``on_records(key, records)`` (the shared record
   cache); call ``on_high_watermarks({key: TailedPosition})`` once per round with every partition
   the tail read records of (the feed publishes and wakes keys), and once a newly assigned
   partition has a high watermark at all (it is then ``following``).

What a push vouches for: the offset after the last record read (a consumer is only served
records below the high watermark, so every offset below it is replicated), and the batch leader
epoch of that record — the epoch of the leader that *appended* it. Not the cached high watermark
of the fetch response: librdkafka follows a new leader silently, so that number may come from a
leader the feed's facts do not know yet, whose log may lack a record the old leader appended
(the acks=1 hole :class:`DelayedReplication`'s epoch fence closes). The feed publishes a push
only while the epoch is at most the leader epoch of its facts; DelayedReplication compares that epoch with the
one noted before its append. Why that is enough: epochs never decrease along a log, so a record
the tail read at or after offset ``X`` carries an epoch at least that of the record at ``X``;
if it is at most the epoch noted before ``X`` was appended, no later leader rewrote ``X``.
4. A partition error meaning "gone" (unknown topic or partition: deleted while watched) stops
   following it and calls ``on_lost(key, error)``; the feed's poll then reports it as a fact.
   Every other error is librdkafka's to retry (leader moved, broker restarting): the consumer
   re-finds the leader and resumes at its position, so nothing is missed or repeated.

The thread never dies of a failure (caught, logged, counted, retried after ``ERROR_BACKOFF_S``)
and holds no purgatory lock: the callbacks run on it, like the poll feed's checks on its thread.

Concurrency contract: ``follow``, ``stats`` and ``following`` may be called from any thread;
``start``/``stop`` by the owner. Callbacks run on the tail thread only.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Self

import structlog
from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from ..clients._clients import FetchedRecord
from ..clients._config import client_config, redacted
from ..reply._correlation import headers_of
from ..settings import KafkaSettings
from ._keys import TopicPartitionKey

__all__ = ["PartitionTail", "TailStats", "TailedPosition"]

_log = structlog.get_logger("purgatory.kafka.tail")

# librdkafka's logical offset "end - 1" (RD_KAFKA_OFFSET_TAIL(1); 0 on an empty partition),
# where ``read_last`` starts a newly followed partition (module doc, step 1).
OFFSET_TAIL_BASE = -2000  # RD_KAFKA_OFFSET_TAIL_BASE: confluent_kafka exports no constant for it
LAST_RECORD = OFFSET_TAIL_BASE - 1
TAIL_BATCH = 1000  # messages per consume(): one call drains a burst without holding much memory
ROUND_S = 0.1  # consume() timeout: how soon a changed set of partitions is (un)assigned
ERROR_BACKOFF_S = 0.5  # after an unexpected failure of a round, before the next one
# The broker holds an idle fetch this long (its DelayedFetch); records end it at once. Shorter
# than the round so an idle consume() returns to apply assignment changes.
FETCH_WAIT_MS = 100
JOIN_TIMEOUT_S = 10.0
_GONE = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC}
)

RecordsCallback = Callable[[TopicPartitionKey, list[FetchedRecord]], None]


@dataclass(frozen=True, slots=True)
class TailedPosition:
    """What one round read of a partition vouches for (module doc: "What a push vouches for")."""

    read_to: int  # the offset after the last record read: every offset below it is replicated
    leader_epoch: int | None  # that record's batch leader epoch; None: the broker sent none


HighWatermarksCallback = Callable[[dict[TopicPartitionKey, TailedPosition]], None]
LostCallback = Callable[[TopicPartitionKey, str], None]


@dataclass
class TailStats:
    """Counters of the tail's work (benchmarks and tests read them)."""

    rounds: int = 0
    records: int = 0
    pushes: int = 0  # positions handed to the feed
    assigned: int = 0
    lost: int = 0
    failures: int = 0
    last_error: str | None = None
    following: frozenset[TopicPartitionKey] = field(default_factory=frozenset)


class PartitionTail:
    """Tails the partitions it is told to follow and pushes records and high watermarks (module doc)."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        bootstrap_servers: str | None = None,
        on_records: RecordsCallback,
        on_high_watermarks: HighWatermarksCallback,
        on_lost: LostCallback,
        name: str = "kafka",
        read_last: bool = False,
    ) -> None:
        # Where a newly followed partition is read from (module doc, step 1).
        self._start_at = LAST_RECORD if read_last else OFFSET_END
        self._config: dict[str, str | int | float | bool] = {
            **client_config(settings, bootstrap_servers),
            # Required by the client; never joined (assign only) and never committed under.
            "group.id": f"purgatory-tail-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "latest",
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.min.bytes": 1,
            "socket.nagle.disable": True,
            "log_level": 0,
        }
        self._on_records = on_records
        self._on_high_watermarks = on_high_watermarks
        self._on_lost = on_lost
        self.name = name
        self.stats = TailStats()
        self._lock = threading.Lock()
        self._wanted: frozenset[TopicPartitionKey] = frozenset()
        self._wanted_version = 0
        self._stopping = threading.Event()
        self._changed = threading.Event()  # follow() changed the wanted set
        self._thread: threading.Thread | None = None
        # (topic, partition) of a fetched message -> its key; only the tail thread touches it
        self._keys: dict[tuple[str, int], TopicPartitionKey] = {}

    def follow(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Follow exactly ``keys`` from the next round on (new ones from their end, module doc step 1)."""
        wanted = frozenset(keys)
        with self._lock:
            if wanted != self._wanted:
                self._wanted = wanted
                self._wanted_version += 1
                self._changed.set()  # an idle tail assigns it now, not after its round's wait

    def following(self, key: TopicPartitionKey) -> bool:
        """True once ``key`` is assigned and a fetch response gave its high watermark."""
        return key in self.stats.following

    def start(self) -> Self:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name=f"kafka-tail-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(JOIN_TIMEOUT_S)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        _log.debug("kafka_tail_connect", config=redacted(self._config))
        try:
            consumer = Consumer(self._config)
        except Exception as exc:
            # Nothing is tailed then: following() stays False for every key, so the feed keeps
            # polling them every interval (the fallback) rather than waiting for pushes.
            self.stats.failures += 1
            self.stats.last_error = repr(exc)
            _log.exception("kafka_tail_start_failed", tail=self.name)
            return
        assigned: set[TopicPartitionKey] = set()
        version = -1
        try:
            while not self._stopping.is_set():
                try:
                    with self._lock:
                        wanted, current = self._wanted, self._wanted_version
                        self._changed.clear()  # under the lock: a follow() after this sets it again
                    if current != version:
                        self._reassign(consumer, assigned, wanted)
                        version = current
                    if not assigned:
                        self._changed.wait(ROUND_S)  # a lone produce's partition is followed at once
                        continue
                    self._round(consumer, assigned)
                except Exception as exc:  # the tail must outlive anything: count, log, back off
                    self.stats.failures += 1
                    self.stats.last_error = repr(exc)
                    _log.exception("kafka_tail_round_failed", tail=self.name)
                    self._stopping.wait(ERROR_BACKOFF_S)
        finally:
            consumer.close()

    def _reassign(
        self, consumer: Consumer, assigned: set[TopicPartitionKey], wanted: frozenset[TopicPartitionKey]
    ) -> None:
        gone = [k for k in assigned if k not in wanted]
        new = [k for k in wanted if k not in assigned]
        if gone:
            consumer.incremental_unassign([TopicPartition(k.topic, k.partition) for k in gone])
            assigned.difference_update(gone)
        if new:
            consumer.incremental_assign([TopicPartition(k.topic, k.partition, self._start_at) for k in new])
            assigned.update(new)
            self.stats.assigned += len(new)
        if gone or new:
            self.stats.following = frozenset(k for k in self.stats.following if k in assigned)

    def _round(self, consumer: Consumer, assigned: set[TopicPartitionKey]) -> None:
        # poll() returns as soon as one message is there; consume(n, timeout) would wait for n
        # messages or the whole timeout (a batching delay on every wake-up). The rest of the
        # burst already fetched is drained without waiting.
        first = consumer.poll(ROUND_S)
        messages = [] if first is None else [first, *consumer.consume(TAIL_BATCH, 0)]
        self.stats.rounds += 1
        batches: dict[TopicPartitionKey, list[FetchedRecord]] = {}
        epochs: dict[TopicPartitionKey, int | None] = {}
        keys = self._keys
        for message in messages:
            error = message.error()
            topic, partition = message.topic() or "", message.partition() or 0
            key = keys.get((topic, partition))
            if key is None:
                # One key per partition, built once: a TopicPartitionKey validates its fields
                # (~0.5 µs per record on the tail thread, a sixth of its round's work per record).
                key = keys[topic, partition] = TopicPartitionKey(topic, partition)
            if error is not None:
                if error.code() in _GONE and key in assigned:
                    self._lose(consumer, assigned, key, error.str())
                continue
            record = FetchedRecord(
                message.offset() or 0,
                message.key(),
                message.value(),
                message.timestamp()[1],
                headers_of(message.headers()),
            )
            batches.setdefault(key, []).append(record)
            epoch = message.leader_epoch()  # the last record's counts: epochs only grow along a log
            epochs[key] = epoch if epoch is not None and epoch >= 0 else None
        moved: dict[TopicPartitionKey, TailedPosition] = {}
        for key, records in batches.items():
            self.stats.records += len(records)
            self._on_records(key, records)
            moved[key] = TailedPosition(records[-1].offset + 1, epochs[key])
        following = self.stats.following
        newly = [k for k in assigned if k not in following and self._has_high_watermark(consumer, k)]
        if newly:
            self.stats.following = self.stats.following | frozenset(newly)
        if moved or newly:
            self.stats.pushes += len(moved)
            self._on_high_watermarks(moved)

    @staticmethod
    def _has_high_watermark(consumer: Consumer, key: TopicPartitionKey) -> bool:
        """True once a fetch response gave ``key``'s high watermark: the tail reads it from a
        fixed position, so every record appended from now on reaches it."""
        try:
            _low, high = consumer.get_watermark_offsets(TopicPartition(key.topic, key.partition), cached=True)
        except KafkaException:
            return False
        return high >= 0

    def _lose(
        self, consumer: Consumer, assigned: set[TopicPartitionKey], key: TopicPartitionKey, why: str
    ) -> None:
        consumer.incremental_unassign([TopicPartition(key.topic, key.partition)])
        assigned.discard(key)
        self.stats.lost += 1
        self.stats.following = frozenset(k for k in self.stats.following if k != key)
        _log.info("kafka_tail_partition_lost", tail=self.name, partition=key.label, error=why)
        self._on_lost(key, why)
