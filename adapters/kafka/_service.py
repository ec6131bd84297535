"""KafkaPurgatory: a purgatory, its change feed, and the clients, wired for a service.

``with KafkaPurgatory.connect(settings) as kp:`` builds a :class:`DelayedOperationPurgatory`,
a :class:`ClusterView`, a :class:`ChangeFeed` attached to the purgatory, a
:class:`RecordProducer` and a :class:`RecordReader`, and starts the feed. Then:

* ``op = kp.produce([ProducerRecord("orders", b"...")])`` appends with ``acks=1`` and returns the
  submitted :class:`DelayedProduce` (``op.wait(s)`` or ``await kp.produce_async(...)``);
  ``kp.append(records)`` appends only (:class:`FencedAppender`: offsets and leader epochs).
* ``op = kp.fetch({TopicPartitionKey("orders", 0): 42}, max_wait_ms=500)`` submits a long poll.
* ``kp.submit(op)`` submits any :class:`KafkaOperation`; ``await kp.watch(op)`` from asyncio.

Submission validates topics first (one DescribeTopics for the operation's topics):
an unknown topic raises :class:`UnknownTopicError` before anything is watched — except for
``DelayedTopicReady``, whose point is to wait for a topic to appear.

Concurrency contract: all methods are thread-safe; the async ones never block the event loop:
their blocking Kafka calls (validation, the append) run on the purgatory's own bounded pool
(:class:`KafkaCalls`), never the loop's default executor, each awaited with its deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from purgatory import DelayedOperationPurgatory, Outcome
from purgatory.settings import KafkaSettings, Settings

from ._append import Appended, FencedAppender
from ._calls import KafkaCalls
from ._clients import ProducerRecord, RecordProducer, RecordReader
from ._errors import UnknownTopicError
from ._feed import ChangeFeed
from ._keys import GroupPartitionKey, TopicKey, TopicPartitionKey
from ._operations import DelayedFetch, DelayedProduce, DelayedTopicReady, KafkaOperation
from ._view import ClusterView

__all__ = ["KafkaPurgatory"]

Op = TypeVar("Op", bound=KafkaOperation)

# The async methods' pool: threads blocked at most a client timeout each, and the calls admitted.
ASYNC_CALL_THREADS, ASYNC_CALL_BACKLOG = 4, 1024


class KafkaPurgatory:
    """A purgatory whose Kafka operations are completed by a change feed (see the module docstring)."""

    def __init__(
        self,
        purgatory: DelayedOperationPurgatory[Any],
        feed: ChangeFeed,
        producer: RecordProducer,
        reader: RecordReader,
        *,
        owns_purgatory: bool = True,
    ) -> None:
        self.purgatory = purgatory
        self.feed = feed
        self.view = feed.view
        self.producer = producer
        self.appender = FencedAppender(producer, feed, feed.view)
        self.reader = reader
        self.settings = feed.settings
        self._owns_purgatory = owns_purgatory
        self.calls = KafkaCalls(f"purgatory-{purgatory.name}", ASYNC_CALL_THREADS, ASYNC_CALL_BACKLOG)
        feed.attach(purgatory)

    @classmethod
    def connect(
        cls,
        settings: Settings | KafkaSettings | None = None,
        *,
        bootstrap_servers: str | None = None,
        name: str = "kafka",
        purgatory: DelayedOperationPurgatory[Any] | None = None,
    ) -> KafkaPurgatory:
        """Build everything from settings and start the feed (no Kafka request until work arrives)."""
        full = settings if isinstance(settings, Settings) else None
        kafka = settings.kafka if isinstance(settings, Settings) else (settings or KafkaSettings())
        owns = purgatory is None
        if purgatory is None:
            options = full.for_purgatory(name) if full is not None else {}
            purgatory = DelayedOperationPurgatory(
                name,
                purge_interval=options.get("purge_interval", 1000),
                max_pending=options.get("max_pending"),
                reaper_poll_ms=options.get("reaper_poll_ms", 200),
            )
        view = ClusterView(kafka, bootstrap_servers=bootstrap_servers)
        feed = ChangeFeed(view, settings=kafka, name=name)
        service = cls(
            purgatory,
            feed,
            RecordProducer(kafka, bootstrap_servers=bootstrap_servers),
            RecordReader(kafka, bootstrap_servers=bootstrap_servers),
            owns_purgatory=owns,
        )
        feed.start()
        return service

    # -- submission -----------------------------------------------------------------------------

    def _validate(self, op: KafkaOperation) -> None:
        if isinstance(op, DelayedTopicReady):
            return
        topics = set()
        for key in op.watch_keys():
            if isinstance(key, TopicPartitionKey | GroupPartitionKey | TopicKey):
                topics.add(key.topic)
        missing = sorted(t for t, exists in self.view.topic_exists(topics).items() if not exists)
        if missing:
            raise UnknownTopicError(missing[0], detail=f"{type(op).__name__} was not submitted")

    def submit(self, op: Op, *, validate: bool = True) -> Op:
        """Validate, then ``try_complete_else_watch(op, op.watch_keys())``; return ``op``."""
        if validate:
            self._validate(op)
        try:
            self.purgatory.try_complete_else_watch(op, op.watch_keys())
        except BaseException:
            # Refused (PurgatoryFullError, closed, try_complete raised): the feed counted the op's
            # keys when it was offered; release them or they would be polled forever.
            self.feed.on_finished(self.purgatory.name, op)
            raise
        return op

    async def watch(self, op: Op, *, validate: bool = True) -> Outcome:
        """asyncio: submit and await the outcome (validation runs on ``self.calls``, bounded)."""
        if validate:
            await self.calls.run(
                self._validate, op, timeout_s=self.view.request_timeout_s + 1.0, what="DescribeTopics"
            )
        try:
            return await self.purgatory.watch(op, op.watch_keys())
        except BaseException:
            self.feed.on_finished(self.purgatory.name, op)  # as in submit(); a no-op once finished
            raise

    def append(self, records: Iterable[ProducerRecord], *, timeout_s: float = 10.0) -> Appended:
        """Append ``records`` (acks=1), noting the leader epochs first (what DelayedProduce needs)."""
        return self.appender.append(records, timeout_s=timeout_s)

    def produce(
        self, records: Iterable[ProducerRecord], *, delay_ms: int | None = None, timeout_s: float = 10.0
    ) -> DelayedProduce:
        """Append ``records`` (acks=1), then hold a :class:`DelayedProduce` until they are replicated."""
        appended = self.append(records, timeout_s=timeout_s)
        return self.submit(DelayedProduce(self.feed, appended, delay_ms=delay_ms), validate=False)

    async def produce_async(
        self, records: Iterable[ProducerRecord], *, delay_ms: int | None = None, timeout_s: float = 10.0
    ) -> DelayedProduce:
        records = list(records)
        appended = await self.calls.run(
            self.appender.append, records, timeout_s, timeout_s=timeout_s, what="the append"
        )
        op = DelayedProduce(self.feed, appended, delay_ms=delay_ms)
        await self.purgatory.watch(op, op.watch_keys())
        return op

    def fetch(self, fetch_offsets: Mapping[TopicPartitionKey, int], **options: Any) -> DelayedFetch:
        """Submit a long poll :class:`DelayedFetch` (min_records, min_bytes, max_bytes, max_wait_ms)."""
        return self.submit(DelayedFetch(self.feed, self.reader, fetch_offsets, **options))

    async def fetch_async(
        self, fetch_offsets: Mapping[TopicPartitionKey, int], **options: Any
    ) -> DelayedFetch:
        op = DelayedFetch(self.feed, self.reader, fetch_offsets, **options)
        await self.watch(op)
        return op

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the feed, drain the purgatory (if ours), close the clients."""
        self.feed.stop()
        self.feed.detach(self.purgatory)
        if self._owns_purgatory:
            self.purgatory.shutdown()
        self.calls.close()
        self.producer.close()
        self.reader.close()
        self.view.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
