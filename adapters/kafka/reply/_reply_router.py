"""ReplyRouter: the requester's side of request-reply — send requests, route replies to their waiters.

One reply topic serves a whole group of service instances (docs/design.md §9). Each instance
reads only the reply partitions it *owns* and names one of them — its *home*, the lowest
owned partition the tail reads — in every request it sends (``kafka_replyPartition``), so
replies come back to the instance that waits for them::

    instance A ──request (reply to replies-0)──► requests ──► responder group "pricer"
         ▲                                                          │
         └── tail of replies-0,1 ◄── replies-0 ◄──reply (corr id)──┘
    instance B: owns replies-2,3, names them in its own requests

Ownership comes from the scale-out layer (:class:`PartitionOwnership`: a paused consumer group
on the reply topic, ``group=...``); without a group every partition is this instance's (one
requester, or instances that each read every reply and drop the others'). Reading is the
:class:`PartitionTail` (assign, no group: the broker's fetch long poll wakes it on a reply).
The two are separate on purpose: when a rebalance takes partition ``p`` away, new requests stop
naming ``p`` at once, but the tail keeps reading ``p`` until the requests that named it finished,
so no reply is stranded by a move (the new owner sees those replies as unknown and drops them).

Routing, per reply record (tail thread): its correlation id names a pending
:class:`DelayedRequest` → ``offer`` it, then ``purgatory.check_and_complete(key)``. Not pending:
the id is looked up among recently finished requests (bounded, ``recent`` ids) and counted as a
*late* reply (the request had expired or failed: journaled as a ``LateReply`` operation on the
correlation key), a *duplicate* (it had its answer already), or *unknown* (another instance's, or
older than ``recent``).

Why one home partition, not the owned ones in turn: the reply stream then wakes one fetch of
the tail, not one per partition (one per broker with 3 brokers). Measured at 1,000 round trips/s
(1 broker, 2 reply partitions, 3 runs each alternating, medians, shared machine at load 5-10):
the tail's Python thread 33 instead of 48 µs of CPU per reply, its librdkafka thread 8 instead
of 17, the broker 142 instead of 226 µs per round trip (spread 129-223 and 184-313). The other
owned partitions stay read (a request that named one before a move waits on it) and one of them
becomes the home when the home moves away.

Ready: a partition is named in requests only once the tail reads it (``PartitionTail.following``:
its position is fixed), so a reply can never land before the tail's starting offset.

Concurrency contract: ``start``/``close`` by the owner (``KafkaPurgatory``); ``prepare``,
``send``, ``wait_ready``, ``stats`` from any thread. Reply routing runs on the tail thread;
ownership callbacks on the group thread; ``_finished`` on whichever thread finished a request.
Lock order: ``op.lock`` may be held when ``_finished`` takes ``self._lock``; ``self._lock`` is never
held while calling into an operation or the purgatory.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka.admin import AdminClient

from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome, PurgatoryError

from ..clients._admin import BROKER_DEFAULT, create_topic
from ..clients._clients import FetchedRecord
from ..clients._errors import KafkaAdapterError, KafkaUnavailableError, UnknownTopicError
from ..clients._sender import DEFAULT_LINGER_MS, RecordSender
from ..facts._keys import TopicPartitionKey
from ..facts._tail import PartitionTail, TailedPosition
from ..ops._moved import Moved
from ..ownership._ownership import PartitionOwnership
from ..settings import KafkaSettings, ScaleOutSettings
from ._correlation import (
    CORRELATION_ID,
    DEADLINE_MS,
    ERROR,
    REPLY_FROM,
    REPLY_PARTITION,
    REPLY_TOPIC,
    CorrelationKey,
    Reply,
    encode_partition,
    header,
)
from ._request import DelayedRequest

__all__ = ["LateReply", "ReplyRouter", "ReplyRouterStats"]

_log = structlog.get_logger("purgatory.kafka.replies")

DEFAULT_REPLY_PARTITIONS = 6  # a few per instance of a small group; more instances, more partitions
RECENT_CAPACITY = 100_000  # finished ids remembered to tell late and duplicate replies from unknown
ADMIN_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 30.0  # start(): the first reply partition is read (group join, tail position)


@dataclass
class ReplyRouterStats:
    """Counters of the requester side (benchmarks and tests read them)."""

    requests: int = 0
    replies: int = 0  # reply records read
    answered: int = 0  # requests finished with their replies
    expired: int = 0  # requests finished by their deadline (or cancelled by their caller)
    failed: int = 0  # requests that could not be produced
    duplicates: int = 0  # copies of a reply already counted (while waiting or after the answer)
    late: int = 0  # replies to requests that had expired or failed
    unknown: int = 0  # replies to no request of this instance (another's, or forgotten)
    malformed: int = 0  # reply records without a correlation id


class LateReply(DelayedOperation):
    """Journal record of a reply that came after its request finished (expired or failed).

    Submitted to the request purgatory already answerable: it finishes on its first
    ``try_complete`` and is never watched or timed, so the journal gets a ``created`` event on
    the correlation key and a ``completed`` one, with the other request events.
    """

    def __init__(self, key: CorrelationKey) -> None:
        super().__init__(1)
        self.key = key

    def try_complete(self) -> bool:
        return self.force_complete()

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        pass


def _instance_id() -> str:
    # The member's client.id in the reply group: which process owns which reply partitions
    # (DescribeConsumerGroups / `purgatory kafka owners` show it).
    return f"requester://{socket.gethostname()}/{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ReplyRouter:
    """Sends requests and routes their replies into a purgatory (see the module docstring)."""

    def __init__(
        self,
        settings: KafkaSettings,
        purgatory: DelayedOperationPurgatory[Any],
        admin: AdminClient,
        *,
        topic: str,
        group: str | None = None,
        partitions: int = DEFAULT_REPLY_PARTITIONS,
        replication_factor: int = BROKER_DEFAULT,
        bootstrap_servers: str | None = None,
        name: str = "kafka",
        linger_ms: int = DEFAULT_LINGER_MS,
        recent: int = RECENT_CAPACITY,
    ) -> None:
        self.topic = topic
        self.group = group
        self.purgatory = purgatory
        self.stats = ReplyRouterStats()
        self._settings = settings
        self._bootstrap = bootstrap_servers
        self._admin = admin
        self._partitions = partitions
        self._replication_factor = replication_factor
        self._recent_capacity = recent
        self.sender = RecordSender(
            settings, bootstrap_servers=bootstrap_servers, name=f"requests-{name}", linger_ms=linger_ms
        )
        self.tail = PartitionTail(
            settings,
            bootstrap_servers=bootstrap_servers,
            on_records=self._on_records,
            on_high_watermarks=self._on_high_watermarks,
            on_lost=self._on_lost,
            name=f"replies-{name}",
        )
        self.ownership: PartitionOwnership | None = None
        self._lock = threading.Lock()
        self._ready_changed = threading.Condition(self._lock)
        self._pending: dict[str, DelayedRequest] = {}
        self._recent: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._owned: frozenset[int] = frozenset()
        self._inflight: collections.Counter[int] = collections.Counter()
        self._ready: tuple[int, ...] = ()
        self._started = False
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> ReplyRouter:
        """Create the reply topic if missing, take this instance's partitions, start reading them."""
        with self._lock:
            if self._started:
                return self
            self._started = True
        try:
            create_topic(
                self._admin,
                self.topic,
                partitions=self._partitions,
                replication_factor=self._replication_factor,
                timeout_s=ADMIN_TIMEOUT_S,
            )
            count = self._partition_count() if self.group is None else 0
        except BaseException:
            with self._lock:
                self._started = False  # Kafka did not answer: the next request tries again
            raise
        self.tail.start()
        if self.group is None:
            self._set_owned(frozenset(range(count)))
        else:
            self.ownership = PartitionOwnership(
                self._settings,
                # Not the service's scale-out (enabled stays False: no secret is needed): the
                # reply group only splits reply partitions and sends nothing to other members.
                ScaleOutSettings(group_id=self.group, topics=(self.topic,)),
                advertised_url=_instance_id(),
                bootstrap_servers=self._bootstrap,
            )
            self.ownership.add_listener(self)
            self.ownership.start()
        _log.info("reply_router_started", topic=self.topic, group=self.group)
        return self

    def _partition_count(self) -> int:
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            metadata = self._admin.list_topics(self.topic, timeout=ADMIN_TIMEOUT_S)
            described = metadata.topics.get(self.topic)
            if described is not None and described.error is None and described.partitions:
                return len(described.partitions)
            if time.monotonic() >= deadline:
                raise UnknownTopicError(self.topic, detail="reply topic has no partitions")
            time.sleep(0.1)  # a topic just created: its metadata propagates with no event to wait on

    def close(self) -> None:
        """Leave the reply group, stop reading replies, flush requests still queued."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.ownership is not None:
            self.ownership.close()
        self.tail.stop()
        self.sender.close()

    # -- ownership (group thread) ---------------------------------------------------------------

    def on_assigned(self, partitions: frozenset[TopicPartitionKey], generation: int) -> None:
        self._set_owned(self._owned | {k.partition for k in partitions if k.topic == self.topic})

    def on_revoked(self, partitions: frozenset[TopicPartitionKey], moved: Moved) -> None:
        # New requests stop naming these now; the tail keeps them while requests wait on them.
        self._set_owned(self._owned - {k.partition for k in partitions if k.topic == self.topic})

    def _set_owned(self, owned: frozenset[int]) -> None:
        with self._lock:
            self._owned = owned
            self._refollow()

    def _refollow(self) -> None:
        # Under self._lock. Read what is owned or still awaited by a request that named it.
        wanted = self._owned | {p for p, n in self._inflight.items() if n > 0}
        self.tail.follow(TopicPartitionKey(self.topic, p) for p in wanted)
        self._update_ready()

    def _update_ready(self) -> None:
        ready = tuple(sorted(p for p in self._owned if self.tail.following(TopicPartitionKey(self.topic, p))))
        if ready != self._ready:
            self._ready = ready
            self._ready_changed.notify_all()

    # -- tail callbacks (tail thread) -----------------------------------------------------------

    def _on_high_watermarks(self, moved: dict[TopicPartitionKey, TailedPosition]) -> None:
        # The first high watermark of a partition means the tail reads it from a fixed position.
        # Called every round the tail fetched something: nothing to do once all owned are ready.
        if len(self._ready) == len(self._owned):
            return
        with self._lock:
            self._update_ready()

    def _on_lost(self, key: TopicPartitionKey, why: str) -> None:
        _log.warning("reply_partition_lost", partition=key.label, error=why)
        with self._lock:
            self._update_ready()

    def _on_records(self, key: TopicPartitionKey, records: list[FetchedRecord]) -> None:
        for record in records:
            self.stats.replies += 1
            raw = header(record.headers, CORRELATION_ID)
            if raw is None:
                self.stats.malformed += 1
                continue
            correlation_id = raw.decode("utf-8", "replace")
            op = self._pending.get(correlation_id)
            if op is None:
                self._unmatched(correlation_id, key)
                continue
            responder = header(record.headers, REPLY_FROM)
            error = header(record.headers, ERROR)
            reply = Reply(
                record.value,
                record.key,
                record.headers,
                None if responder is None else responder.decode("utf-8", "replace"),
                None if error is None else error.decode("utf-8", "replace"),
                key.partition,
                record.offset,
            )
            if op.offer(reply):
                self.purgatory.check_and_complete(op.key)
            else:
                self.stats.duplicates += 1

    def _unmatched(self, correlation_id: str, key: TopicPartitionKey) -> None:
        with self._lock:
            how = self._recent.get(correlation_id)
        if how == "answered":
            self.stats.duplicates += 1
        elif how is None:
            self.stats.unknown += 1
        else:
            self.stats.late += 1
            _log.info("late_reply_ignored", correlation_id=correlation_id, request=how, partition=key.label)
            late = LateReply(CorrelationKey(correlation_id))
            # Refused when closed while a reply arrived: it was counted and logged already.
            with contextlib.suppress(PurgatoryError):
                self.purgatory.try_complete_else_watch(late, (late.key,))

    # -- requests (any thread) ------------------------------------------------------------------

    def wait_ready(self, timeout_s: float) -> tuple[int, ...]:
        """Block until some reply partition is read (or ``timeout_s``); the ready partitions."""
        with self._lock:
            self._ready_changed.wait_for(lambda: bool(self._ready) or self._closed, timeout_s)
            return self._ready

    def ready(self) -> tuple[int, ...]:
        return self._ready

    def prepare(
        self, topic: str, *, timeout_ms: int, replies: int = 1, partial: bool = False
    ) -> DelayedRequest:
        """A registered request naming this instance's home reply partition (lowest ready one).

        Raises :class:`KafkaUnavailableError` when no reply partition is ready (see
        :meth:`wait_ready`).
        """
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty string, got {topic!r}")
        ready = self._ready
        if not ready:
            raise KafkaUnavailableError(
                f"no partition of reply topic {self.topic!r} is read by this instance yet"
                + (f" (group {self.group!r} has not assigned one)" if self.group else "")
            )
        partition = ready[0]  # the home partition (module doc: why one, not each in turn)
        op = DelayedRequest(
            # 128 random bits as 32 hex digits, like uuid4().hex without building a UUID (a
            # third of the cost, ~1.5 of 5 µs per request).
            secrets.token_hex(16),
            topic,
            timeout_ms=timeout_ms,
            wanted=replies,
            partial=partial,
            reply_partition=partition,
            on_finished=self._finished,
        )
        with self._lock:
            if self._closed:
                raise KafkaAdapterError("the reply router is closed")
            self._pending[op.correlation_id] = op
            self._inflight[partition] += 1
        self.stats.requests += 1
        return op

    def send(self, op: DelayedRequest, value: bytes | None, key: bytes | None = None) -> None:
        """Produce ``op``'s request; a refused or undelivered record fails ``op`` with its error."""
        deadline_ms = time.time_ns() // 1_000_000 + op.timeout_ms
        headers = [
            (CORRELATION_ID, op.correlation_id.encode()),
            (REPLY_TOPIC, self.topic.encode()),
            (DEADLINE_MS, str(deadline_ms).encode()),
        ]
        if op.reply_partition is not None:
            headers.append((REPLY_PARTITION, encode_partition(op.reply_partition)))

        def delivered(error: KafkaAdapterError | None, _message: object) -> None:
            if error is not None:
                op.fail(error)

        try:
            self.sender.send(op.topic, value, key=key, headers=headers, on_delivery=delivered)
        except KafkaAdapterError as exc:
            op.fail(exc)
            raise

    def _finished(self, op: DelayedRequest) -> None:
        # on_complete of a request, on the thread that finished it (op.lock may be held).
        if op.error is not None:
            how = "failed"
            self.stats.failed += 1
        elif op.outcome is Outcome.COMPLETED:
            how = "answered"
            self.stats.answered += 1
        else:
            how = "expired" if op.outcome is Outcome.EXPIRED else "cancelled"
            self.stats.expired += 1
        with self._lock:
            self._pending.pop(op.correlation_id, None)
            self._recent[op.correlation_id] = how
            if len(self._recent) > self._recent_capacity:
                self._recent.popitem(last=False)
            partition = op.reply_partition
            if partition is not None:
                self._inflight[partition] -= 1
                if self._inflight[partition] <= 0:
                    del self._inflight[partition]
                    if partition not in self._owned:
                        self._refollow()  # a moved partition's last waiter is done: stop reading it

    def pending(self) -> int:
        return len(self._pending)
