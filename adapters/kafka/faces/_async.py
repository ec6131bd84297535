"""AsyncKafkaPurgatory: the asyncio face of a :class:`KafkaPurgatory` (``KafkaPurgatory.aio``).

Every call submits one operation and awaits its frozen result without blocking the loop; blocking
Kafka calls run on the purgatory's bounded :class:`KafkaCalls` pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from purgatory import DelayedOperationPurgatory, Outcome

from ..clients._admin import BROKER_DEFAULT
from ..clients._clients import ProducerRecord
from ..clients._errors import KafkaUnavailableError
from ..facts._feed import ChangeFeed
from ..facts._keys import TopicPartitionKey
from ..ops._fetch import DEFAULT_FETCH_MAX_BYTES
from ..ops._metadata_waits import DelayedConsumerCommit, DelayedDeleteRecords, DelayedTopicReady
from ..ops._results import (
    CommitResult,
    DeleteRecordsResult,
    ErrorCode,
    FetchResult,
    ProduceResult,
    TopicReadyResult,
)
from ..reply._request import DelayedRequest, RequestResult
from ..settings import KafkaSettings
from ._defaults import ADMIN_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_MS, DRAIN_SIGNALS, REPLY_READY_TIMEOUT_S, Op

if TYPE_CHECKING:
    from ._service import KafkaPurgatory

__all__ = ["AsyncKafkaPurgatory"]


class AsyncKafkaPurgatory:
    """The asyncio face of a :class:`KafkaPurgatory`: every call is awaited, none blocks the loop.

    Got from ``async with KafkaPurgatory.connect(settings) as kp`` or ``KafkaPurgatory.aio``.
    Each awaitable submits one delayed operation and returns its frozen result when it finished
    (completed, or expired at its timeout: a result, not an exception). Kafka-side conditions are
    statuses in that result, not exceptions: ``KAFKA_UNAVAILABLE`` (Kafka did not answer until the
    deadline), ``UNKNOWN_TOPIC_OR_PARTITION`` (answered at once), ``NOT_LEADER_OR_FOLLOWER``,
    ``SHUTTING_DOWN`` (the purgatory is closing: every waiting call gets it within a second);
    each result's ``shutting_down`` / ``unavailable`` say "503, retry later". Exceptions are left
    for the caller's mistakes (bad arguments, a closed purgatory). Cancelling the awaiting task
    cancels the operation (``Outcome.CANCELLED``; it is never left watched).

    Attributes:
        sync: the :class:`KafkaPurgatory` behind it (feed, view, purgatories, clients).
    """

    def __init__(self, sync: KafkaPurgatory) -> None:
        self.sync = sync

    @property
    def feed(self) -> ChangeFeed:
        """The change feed (a :class:`FactSource` for operations you build yourself)."""
        return self.sync.feed

    @property
    def purgatories(self) -> dict[str, DelayedOperationPurgatory[Any]]:
        """The purgatories created so far, by name."""
        return self.sync.purgatories

    @property
    def settings(self) -> KafkaSettings:
        """The Kafka settings in use (timeouts default from here)."""
        return self.sync.settings

    async def _admin(self, call: Any, *args: Any, what: str, timeout_s: float = ADMIN_TIMEOUT_S) -> Any:
        # Admin requests block up to ADMIN_TIMEOUT_S: on the bounded pool, with a deadline.
        return await self.sync.calls.run(call, *args, timeout_s=timeout_s + 1.0, what=what)

    def drain_on_signals(self, signals: Iterable[int] = DRAIN_SIGNALS) -> bool:
        """See :meth:`KafkaPurgatory.drain_on_signals`: answer waiting calls ``SHUTTING_DOWN``
        as soon as SIGTERM / SIGINT arrive, then let the server's own handler run."""
        return self.sync.drain_on_signals(signals)

    async def watch(self, op: Op, *, validate: bool = True) -> Outcome:
        """Submit any :class:`KafkaOperation` and await its outcome."""
        return await self.sync.watch(op, validate=validate)

    async def produce(
        self,
        records: Iterable[ProducerRecord],
        *,
        timeout_ms: int | None = None,
    ) -> ProduceResult:
        """Produce ``records`` with ``acks=all`` (idempotent) and answer once Kafka acknowledged
        each of them: every in-sync replica has it, and there are ``min.insync.replicas``.

        ``timeout_ms`` (default ``kafka.produce_timeout_ms``) bounds the wait; records not
        acknowledged by then answer ``REQUEST_TIMED_OUT`` (they may still be written, once).
        Leader changes and broker restarts within it are ridden out by the producer's retries.
        Kafka's refusals come back as statuses (``result.statuses``, ``result.record_statuses``);
        a bad record raises when it is built (:class:`ProducerRecord`).
        """
        op = await self.sync.produce_async(records, delay_ms=timeout_ms)
        return op.result()

    async def fetch(
        self,
        fetch_offsets: Mapping[TopicPartitionKey, int],
        *,
        min_records: int = 1,
        min_bytes: int | None = None,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        max_wait_ms: int | None = None,
    ) -> FetchResult:
        """Long poll: answer once ``min_records`` (or ``min_bytes``) arrived past the offsets, or at
        ``max_wait_ms`` (default ``kafka.fetch_max_wait_ms``) with whatever arrived."""
        op = await self.sync.fetch_async(
            fetch_offsets,
            min_records=min_records,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
        )
        return op.result()

    async def wait_committed(
        self, group: str, targets: Mapping[TopicPartitionKey, int], timeout_ms: int | None = None
    ) -> CommitResult:
        """Answer once consumer group ``group`` committed at least ``targets[partition]`` everywhere.

        The "my record was processed" barrier: after producing offset ``n``, wait for ``n + 1``.
        ``timeout_ms`` defaults to ``kafka.commit_timeout_ms``.
        """
        op = DelayedConsumerCommit(self.sync.feed, group, targets, delay_ms=timeout_ms)
        await self.sync.watch(op)
        return op.result()

    async def wait_topic_ready(self, topic: str, timeout_ms: int | None = None) -> TopicReadyResult:
        """Answer once ``topic`` exists and every partition has a leader (it may not exist yet)."""
        op = DelayedTopicReady(self.sync.feed, topic, delay_ms=timeout_ms)
        await self.sync.watch(op)
        return op.result()

    async def delete_records(
        self, before: Mapping[TopicPartitionKey, int], timeout_ms: int | None = None
    ) -> DeleteRecordsResult:
        """Delete every record before ``before[partition]``; answer once the log start offsets moved."""
        op = DelayedDeleteRecords(self.sync.feed, before, delay_ms=timeout_ms)
        try:
            issued = await self._admin(
                self.sync._issue_delete, op, what="DeleteRecords", timeout_s=op.delay_ms / 1000.0
            )
        except KafkaUnavailableError as exc:  # the pool's deadline or refusal: Kafka did not answer
            self.sync._refuse(op, ErrorCode.KAFKA_UNAVAILABLE, exc)  # a no-op if answered meanwhile
            issued = False
        if issued:
            await self.sync.watch(op, validate=False)
        return op.result()

    async def create_topic(
        self,
        topic: str,
        *,
        partitions: int = BROKER_DEFAULT,
        replication_factor: int = BROKER_DEFAULT,
        config: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
    ) -> TopicReadyResult:
        """Create ``topic`` unless it exists, then answer once every partition has a leader.

        Kafka not answering (within ``timeout_ms`` when given) is answered ``KAFKA_UNAVAILABLE``;
        a refusal of the request itself (a bad name, more replicas than brokers) raises.
        """
        op = DelayedTopicReady(self.sync.feed, topic, delay_ms=timeout_ms)
        try:
            await self._admin(
                lambda: self.sync.create_topic(
                    topic, partitions=partitions, replication_factor=replication_factor, config=config
                ),
                what="CreateTopics",
                timeout_s=min(ADMIN_TIMEOUT_S, op.delay_ms / 1000.0),
            )
        except KafkaUnavailableError as exc:
            self.sync._refuse(op, ErrorCode.KAFKA_UNAVAILABLE, exc)
            return op.result()
        await self.sync.watch(op)
        return op.result()

    async def request(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        timeout_ms: int | None = None,
        replies: int = 1,
        partial: bool = False,
    ) -> RequestResult:
        """Send a request to ``topic`` and answer with its reply (docs/design.md §9).

        The record carries ``kafka_correlationId``, ``kafka_replyTopic`` / ``kafka_replyPartition``
        (one of this instance's reply partitions) and its deadline; a :class:`Responder` (or a
        Spring ``@SendTo`` listener) answers on the reply topic. ``replies=N`` gathers N replies
        from distinct responder groups (scatter-gather). At ``timeout_ms`` (default 30 s):
        :class:`RequestTimeoutError` carrying the replies that arrived, or with ``partial=True`` a
        :class:`RequestResult` with ``complete=False``. Copies of a reply count once; replies
        after the deadline are dropped (``kp.sync.replies().stats``). Cancelling the awaiting task
        cancels the request.
        """
        timeout = DEFAULT_REQUEST_TIMEOUT_MS if timeout_ms is None else timeout_ms
        router = self.sync.replies()
        if not router.ready():  # the first request: create the topic, join, position the tail
            await self.sync.calls.run(
                self.sync._started_router,
                timeout_s=ADMIN_TIMEOUT_S + REPLY_READY_TIMEOUT_S + 1.0,
                what="the reply topic",
            )
        op = router.prepare(topic, timeout_ms=timeout, replies=replies, partial=partial)
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def answered(_op: DelayedRequest) -> None:  # on the loop, once (watch_then_call)
            if not finished.done():
                finished.set_result(None)

        # The sync face's order (watched, then sent; see _watch_then_send for why).
        self.sync._watch_then_send(
            router,
            op,
            value,
            key,
            lambda: router.purgatory.watch_then_call(op, op.watch_keys(), answered, loop),
        )
        try:
            await finished
        except asyncio.CancelledError:
            router.purgatory.abandon(op)  # as cancelling purgatory.watch's task: CANCELLED, timer removed
            raise
        return op.result()

    async def aclose(self) -> None:
        """Close the :class:`KafkaPurgatory` without blocking the loop: every pending call is
        answered ``SHUTTING_DOWN`` within a second, then the clients close."""
        await self.sync.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
