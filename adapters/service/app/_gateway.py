"""Gateway: the example service's HTTP-facing layer over one :class:`KafkaPurgatory`.

``await gateway.fetch(topic, partition, params)`` submits a :class:`DelayedFetch` (a long poll)
to the ``fetch`` purgatory and ``await gateway.produce(topic, request)`` sends records through
the idempotent producer (``acks=all``) and holds a :class:`DelayedProduce` in the ``produce``
purgatory until Kafka acknowledged each — the leader's own Produce purgatory waits for the
in-sync replicas. The event loop never blocks on the purgatory; one change feed (one batched
admin request per kind of fact per interval) completes the long polls, delivery reports the
produces.

Wiring: the gateway holds one :class:`KafkaPurgatory` (``gateway.kafka``, connected with
``shared_reads=True`` and named ``service``): the cluster view, the change feed, the producer
(``sender``), the shared reader, the journal and the ``fetch`` / ``produce``
purgatories are its, built once there (``gateway.view``, ``.feed``, ``.reader`` and the
others are those very objects).
What is the gateway's is the HTTP side: cached metadata, admission, the bounded call pools,
the fetch-attempt pool, scale-out placement, the collector's thresholds, and Kafka's errors
turned into answers.

Before submitting, the topic and partition are checked against cached metadata (one
DescribeTopics per topic per ``METADATA_MAX_AGE_S``), so an unknown topic or partition is a 404
naming the field, not an operation that waits in vain. Whatever Kafka answers becomes the
client's answer, never a 500 (:func:`._metadata.kafka_error`): an unknown topic 404, a name Kafka refuses
400, a record over the topic's ``max.message.bytes`` 413, anything else 503.

Answer bounds (each Kafka call has its own deadline, see :class:`KafkaCalls`): a produce is
answered within ``kafka.request_timeout_ms`` (the topic's metadata, when not cached) plus its
``timeout_ms``; a long poll within ``kafka.request_timeout_ms`` (metadata, or
the high watermark when no offset is given) plus ``max_wait_ms`` plus one read of what arrived
(``READ_TIMEOUT_S``, 2 s). Slow or unreachable Kafka gives a 503, never a later answer.

Concurrency contract: one gateway per event loop. ``fetch``/``produce`` may run concurrently
(any number of awaiting requests); blocking Kafka calls run on the gateway's own bounded pools
(metadata, reads: one stalled kind never delays another), never on the loop's default
executor, and each is awaited with its deadline. The first completion attempt of an operation
runs on the loop thread, inside ``purgatory.watch``; a fetch declines it there and, only when its
facts say it could complete now, is attempted at once on the gateway's small ``fetch-attempt``
pool (:class:`OffLoopFetch`), so reading records never blocks the loop and a waiter costs O(1):
no task, no executor hop, no re-check of the other waiters on its key. ``start()``
and ``close()`` belong to the owner (the app's lifespan); ``close()`` drains: every waiting
request is answered (EXPIRED, with the records that arrived) first.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import structlog

from purgatory import DelayedOperationPurgatory, Outcome, PurgatoryClosedError, PurgatoryFullError
from purgatory.journal import Journal
from purgatory.settings import ConfigError, Settings

from ...kafka import (
    PURGATORY_NAMES,
    Appended,
    ChangeFeed,
    ClusterView,
    DelayedFetch,
    DelayedProduce,
    DelayedReplication,
    ErrorCode,
    KafkaCalls,
    KafkaPurgatory,
    RecordIdentity,
    RecordSender,
    SharedReadReader,
    TopicPartitionKey,
    configured_bootstrap,
)
from ...kafka.facts._keys import partition_key
from ...kafka.ops._off_loop import OffLoopReplication
from ...kafka.ops._off_loop_fetch import OffLoopFetch
from ...kafka.ops._owned import OwnedFetch, OwnedReplication
from ...kafka.settings import BOOTSTRAP_ENV
from ..answers._budget import AnswerBudget, memory_budget_exceeded
from ..answers._errors import RequestError
from ..scaleout._scaleout import ScaleOut
from ._metadata import TopicMetadata, unknown_partition, unreachable_offset
from ._poll_groups import GROUP_WAIT_FACTOR, PollGroups, PollWaiter, equal_polls
from ._requests import FetchParams, ProduceRequest, producer_records

__all__ = ["FETCH_PURGATORY", "PRODUCE_PURGATORY", "Gateway", "resolve_bootstrap"]

_log = structlog.get_logger("purgatory.service")

FETCH_PURGATORY = PURGATORY_NAMES[DelayedFetch]  # Kafka's broker: "Fetch" purgatory (delayedOperation tag)
PRODUCE_PURGATORY = PURGATORY_NAMES[DelayedProduce]  # Kafka's broker: "Produce" purgatory
# The KafkaPurgatory's name: its change feed's (thread and log names) and its call pool's.
SERVICE_NAME = "service"
# Threads per pool: calls block a thread for up to their client timeout while Kafka hangs, and
# the backlog each pool admits before refusing (503) rather than queueing without end.
METADATA_THREADS, METADATA_BACKLOG = 4, 256
READ_THREADS, READ_BACKLOG = 4, 1024
# Threads attempting fetches whose records are already there (each attempt reads, within the
# reader's READ_TIMEOUT_S when the record cache misses): a few, so a burst of catching-up
# consumers cannot take every core. Queued attempts are bounded by admission.max_waiters.
FETCH_ATTEMPT_THREADS = 4
# librdkafka refuses a record whose key + value exceed the producer's message.max.bytes (this
# default unless kafka.client_config sets it): checked for every record before any is appended,
# so a request is refused whole (413) rather than half appended.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000


def resolve_bootstrap(settings: Settings, bootstrap_servers: str | None = None) -> str:
    """Explicit argument, then ``PURGATORY_KAFKA_BOOTSTRAP``, then ``kafka.bootstrap_servers``.

    The Kafka adapter's provider order (:func:`configured_bootstrap`, docs/design.md §5), so the
    service and ``purgatory run`` agree on which cluster is meant; a ConfigError when none is named.
    """
    servers = configured_bootstrap(settings.kafka, bootstrap_servers)
    if not servers:
        raise ConfigError(
            "the service needs a Kafka cluster: set PURGATORY_KAFKA__BOOTSTRAP_SERVERS "
            f"(or {BOOTSTRAP_ENV}); `purgatory run` starts a local one by itself"
        )
    return servers


class Gateway:
    """The HTTP-facing layer over one :class:`KafkaPurgatory` (see the module docstring)."""

    def __init__(self, settings: Settings, bootstrap_servers: str | None = None) -> None:
        self.settings = settings
        self.bootstrap_servers = resolve_bootstrap(settings, bootstrap_servers)
        # The view, the change feed (started: idle until an operation waits), the clients, the
        # journal and the purgatories: one wiring, KafkaPurgatory's. Logging is the host's to
        # configure and the app registers the metrics in its own registry: neither here.
        self.kafka = KafkaPurgatory.connect(
            settings,
            bootstrap_servers=self.bootstrap_servers,
            name=SERVICE_NAME,
            configure_logging=False,
            metrics=False,
            shared_reads=True,
            gathered_max_bytes=settings.service.gathered_budget_bytes,
        )
        try:
            self._set_up(settings)
        except BaseException:
            self.kafka.close()  # the feed's thread and the clients must not outlive a failed start
            raise

    def _set_up(self, settings: Settings) -> None:
        # Created now (not on the first operation): admission limits are set before any request.
        self.fetch_purgatory: DelayedOperationPurgatory[DelayedFetch] = self.kafka.purgatory_for_kind(
            DelayedFetch
        )
        self.produce_purgatory: DelayedOperationPurgatory[DelayedProduce] = self.kafka.purgatory_for_kind(
            DelayedProduce
        )
        self.replication_purgatory: DelayedOperationPurgatory[DelayedReplication] = (
            self.kafka.purgatory_for_kind(DelayedReplication)
        )
        for purgatory in self.purgatories:
            if purgatory.max_pending_per_key is None:  # purgatories.<name>.max_pending_per_key wins
                purgatory.max_pending_per_key = settings.admission.max_waiters_per_key
        kafka = settings.kafka
        self._last_thread = 0  # see _loop_thread
        self.metadata_calls = KafkaCalls("metadata", METADATA_THREADS, METADATA_BACKLOG)
        self.read_calls = KafkaCalls("read", READ_THREADS, READ_BACKLOG)
        # The view gives up on an admin request after its request timeout (plus its own margin).
        self._metadata_timeout_s = self.view.request_timeout_s + 1.0
        self.metadata = TopicMetadata(self.view, self.feed, self.metadata_calls, self._metadata_timeout_s)
        # The one attempt of a fetch whose records are already there (OffLoopFetch).
        self._attempts = ThreadPoolExecutor(FETCH_ATTEMPT_THREADS, thread_name_prefix="fetch-attempt")
        self._gc_before: tuple[int, int, int] | None = None
        self.message_max_bytes = int(
            kafka.client_config_values().get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES)
        )
        self.serving = False
        self.task_free_fetches = 0  # long polls submitted by fetch_then_call (no task waits for them)
        # Bytes of answers held by connections slow to read them: past it, long polls get a 429.
        self.answer_budget = AnswerBudget(settings.service.answer_budget_bytes)
        # Equal long polls share one operation (issue 30): admission counts their waiters.
        self.polls = PollGroups(
            self._watch_then_call, self.fetch_purgatory.abandon, FETCH_PURGATORY, journal=self.journal
        )
        # Scale-out (docs/design.md §7): this instance serves only the partitions its group assigns it.
        self.scaleout: ScaleOut | None = (
            ScaleOut(settings, self.bootstrap_servers, self.purgatories, self.feed)
            if settings.scaleout.enabled
            else None
        )

    # -- the KafkaPurgatory's parts, by the names the app, metrics and tests read ---------------

    @property
    def purgatories(self) -> tuple[DelayedOperationPurgatory[Any], ...]:
        return (self.fetch_purgatory, self.produce_purgatory, self.replication_purgatory)

    @property
    def view(self) -> ClusterView:
        return self.kafka.view

    @property
    def feed(self) -> ChangeFeed:
        return self.kafka.feed

    @property
    def reader(self) -> SharedReadReader:
        reader = self.kafka.reader
        assert isinstance(reader, SharedReadReader), "the gateway connects with shared_reads=True"
        return reader

    @property
    def sender(self) -> RecordSender:
        return self.kafka.sender

    @property
    def journal(self) -> Journal | None:
        return self.kafka.journal

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start serving (the change feed runs since construction, idle until an operation waits)."""
        if self.scaleout is not None:
            self.scaleout.start()
        thresholds = self.settings.admission.gc_thresholds
        if thresholds is not None:
            # Waiting requests are long-lived objects by the thousand: at the interpreter's
            # default (700 allocations per young collection) the collector re-scans them so
            # often that it bounds registration (purgatory bench fanout, 10,000 long polls:
            # 1,008/s at the defaults, 2,873/s with 50,000/20/100 and the start-up objects frozen).
            self._gc_before = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(*thresholds)
        self.serving = True
        _log.info("service_started", bootstrap=self.bootstrap_servers)

    def close(self) -> None:
        """Stop serving, stop the feed, drain the purgatories, flush the journal, close the clients."""
        self.serving = False
        if self.scaleout is not None:
            self.scaleout.close()  # first: waiting operations are answered MOVED, not drained EXPIRED
        drain = self.settings.drain_on_shutdown
        self.kafka.stop(drain=drain)  # drained waiters get EXPIRED: nobody hangs
        # After the drain (nothing waits on them), before the clients close (an attempt may be
        # reading through the shared reader).
        self._attempts.shutdown(wait=True, cancel_futures=True)
        if self._gc_before is not None:
            gc.set_threshold(*self._gc_before)
            gc.unfreeze()
            self._gc_before = None
        for calls in (self.metadata_calls, self.read_calls):
            calls.close()
        self.kafka.close()  # flushes the journal, closes the clients
        _log.info("service_stopped", drained=drain)

    async def partitions(self, topic: str) -> int:
        """The topic's partition count (cached); a 404 :class:`RequestError` if it does not exist."""
        return await self.metadata.partitions(topic)

    # -- operations -----------------------------------------------------------------------------

    async def fetch(self, topic: str, partition: int, params: FetchParams) -> DelayedFetch:
        """Long poll: the records past ``params.offset``, once enough arrived or ``max_wait_ms`` passed."""
        self._check_answer_budget()
        started = time.monotonic()
        await self.metadata.check_partition(topic, partition, "partition")
        key = partition_key(topic, partition)  # one key object per partition, shared by its waiters
        offset = params.offset
        checked_end = -1
        if offset is None:  # "new records only": start at the high watermark
            offset = await self.metadata.high_watermark(key)
        else:
            checked_end = await self._checked_end(key, offset)
        metadata_s = time.monotonic() - started
        if self.scaleout is not None:
            op = self._fetch_op(key, offset, params, checked_end=checked_end)
            self.scaleout.place(op)
            # Cancelling this await (the client left) finishes the op as CANCELLED inside
            # purgatory.watch.
            await self._watch(op)
        else:
            op = await self._wait_in_group(key, offset, params, checked_end)
        if self.fetch_finished(op, params.offset):
            # One metadata budget per long poll, before and after its wait together: the answer
            # bound (request_timeout_ms + max_wait_ms + one read) holds however slow each call was.
            await self.check_fetch_offset(op, budget_s=max(0.0, self._metadata_timeout_s - metadata_s))
        return op

    async def _checked_end(self, key: TopicPartitionKey, offset: int) -> int:
        """``offset`` when it is past the end the change feed reported and Kafka says it is in
        range after all (416 when it is not), else -1 (the facts decide).

        The feed reports an append a few ms after the produce's answer: a client that produced
        and then polls from the next offset asks for the log's end, which the facts may still put
        one past the high watermark. Kafka's fetch validates the offset against the log itself;
        here one ListOffsets does, only for offsets past the facts' end. The fetch then waits
        for the facts to catch up (``PartitionRead.checked_end``) instead of answering 416.
        """
        known = self.metadata.known_high_watermark(key)
        if known is None or offset <= known:
            return -1
        await self.metadata.check_offset_in_range(key, offset, self._metadata_timeout_s)
        return offset

    async def _wait_in_group(
        self, key: TopicPartitionKey, offset: int, params: FetchParams, checked_end: int = -1
    ) -> DelayedFetch:
        """Wait as one of the equal long polls' group (:mod:`._poll_groups`): its answer's operation.

        O(1) per waiter: joined on the loop, no re-check of the other waiters on the key (a new
        group's OffLoopFetch hands its own attempt off only when the facts say it could complete
        now). Cancelling this await (the client left) takes the waiter out of its group.
        """
        answered: asyncio.Future[DelayedFetch] = asyncio.get_running_loop().create_future()

        def answer(op: DelayedFetch) -> None:
            if not answered.done():
                answered.set_result(op)

        with self._admitted():
            waiter = self._join(key, offset, params, answer, checked_end)
        try:
            return await answered
        except asyncio.CancelledError:
            self.polls.leave(waiter)
            raise

    def _join(
        self,
        key: TopicPartitionKey,
        offset: int,
        params: FetchParams,
        callback: Callable[[DelayedFetch], None],
        checked_end: int = -1,
    ) -> PollWaiter:
        """Join (or start) the group of the long polls equal to this one; its operations are made here."""

        def make_op(wait_ms: int) -> DelayedFetch:
            return self._fetch_op(key, offset, params, wait_ms, checked_end=checked_end)

        equal = equal_polls(key, offset, params.min_records, params.min_bytes, params.max_bytes)
        wait_ms = self._clamped_wait_ms(params.max_wait_ms)
        group_wait_ms = GROUP_WAIT_FACTOR * int(self.settings.admission.max_wait_ms)
        per_key = self.fetch_purgatory.max_pending_per_key
        return self.polls.join(equal, key, wait_ms, group_wait_ms, make_op, callback, per_key)

    def _watch_then_call(self, op: DelayedFetch, callback: Callable[[DelayedFetch], None]) -> None:
        self.kafka.watch_then_call(op, callback)

    @property
    def long_poll_waiters(self) -> int:
        """Long polls waiting (each a request; the fetch purgatory holds one operation per group)."""
        return self.polls.waiters if self.scaleout is None else self.fetch_purgatory.num_delayed()

    def waiting_requests(self) -> int:
        """Requests waiting, what admission counts: long polls by waiter (a group's operation
        answers many), the rest by operation. O(1) each: counters and the timers' counts."""
        others = self.produce_purgatory.num_delayed() + self.replication_purgatory.num_delayed()
        return self.long_poll_waiters + others

    def fetch_then_call(
        self, topic: str, partition: int, params: FetchParams, callback: Callable[[DelayedFetch], None]
    ) -> PollWaiter | None:
        """:meth:`fetch` without awaiting: ``callback(op)`` runs on the loop once the fetch finished.

        For a waiter that is not a task (the protocol-level long poll, :mod:`..http.h1._long_poll`): the
        same checks, the same operation, the same admission. Returns None, having submitted
        nothing, when :meth:`fetch` has to be awaited instead — metadata or the high watermark
        not cached, an unknown partition (its 404 is :meth:`fetch`'s), scale-out on. Raises the
        :class:`RequestError` :meth:`fetch` would (429, 503). Once called back, the caller
        finishes as :meth:`fetch` does: :meth:`fetch_finished`, then maybe
        :meth:`check_fetch_offset`; a waiter that leaves calls :meth:`abandon_fetch`.
        """
        if self.scaleout is not None:
            return None
        # The partition is known to exist if any cached count (fresh or not) covers it: a topic's
        # partitions are never taken away, and a topic deleted (or re-created smaller) since is
        # the op's own UNKNOWN_TOPIC_OR_PARTITION, a 404 as fetch() answers it. Freshness only
        # matters for partitions added since (fetch() refreshes the count): 10,000 polls
        # registering at 600/s on a loaded machine outlived the 5 s cache, and every poll
        # arriving while it refreshed went through ASGI (65% of them, measured).
        known = self.metadata.known_partitions(topic)
        if known is None or partition >= known:
            return None
        key = partition_key(topic, partition)  # one key object per partition, shared by its waiters
        known_end = self.metadata.known_high_watermark(key)
        offset = params.offset if params.offset is not None else known_end
        if offset is None or (known_end is not None and offset > known_end):
            return None  # past the facts' end: fetch() asks Kafka whether it is in range (_checked_end)
        self._check_answer_budget()
        with self._admitted():
            waiter = self._join(key, offset, params, callback)
        self.task_free_fetches += 1
        return waiter

    def _check_answer_budget(self) -> None:
        """429 MEMORY_BUDGET_EXCEEDED while answers held for slow readers spent it (._answer_budget)."""
        if self.answer_budget.spent:
            raise memory_budget_exceeded(self.answer_budget, self.settings.admission.retry_after_s)

    def check_answer_fits(self, answer: bytes) -> None:
        """429 MEMORY_BUDGET_EXCEEDED instead of ``answer`` if holding it would pass the budget."""
        if not self.answer_budget.fits(answer):
            raise memory_budget_exceeded(self.answer_budget, self.settings.admission.retry_after_s)

    def abandon_fetch(self, waiter: PollWaiter) -> None:
        """``waiter`` (from :meth:`fetch_then_call`) left: out of its group, never answered; the
        group's operation is finished CANCELLED (out of the timer) once its last waiter left."""
        self.polls.leave(waiter)

    def _fetch_op(
        self,
        key: TopicPartitionKey,
        offset: int,
        params: FetchParams,
        wait_ms: int | None = None,
        *,
        checked_end: int = -1,
    ) -> DelayedFetch:
        op = (OffLoopFetch if self.scaleout is None else OwnedFetch)(
            self.feed,
            self.reader,
            {key: offset},
            min_records=params.min_records,
            min_bytes=params.min_bytes,
            max_bytes=params.max_bytes,
            max_wait_ms=self._clamped_wait_ms(params.max_wait_ms) if wait_ms is None else wait_ms,
            loop_thread=self._loop_thread(),
            attempts=self._attempts,
        )
        op.parts[0].checked_end = checked_end
        return op

    def _loop_thread(self) -> int:
        """This thread's ident, as one int object for every op made here (a new one is 32 B each)."""
        ident = threading.get_ident()
        if ident != self._last_thread:
            self._last_thread = ident
        return self._last_thread

    def fetch_finished(self, op: DelayedFetch, requested_offset: int | None) -> bool:
        """Raise the answer of a finished fetch that is an error (416, 404); True when its offset
        must still be checked (:meth:`check_fetch_offset`), False when ``op`` is the answer."""
        (part,) = op.parts
        key, offset = part.key, part.fetch_offset
        if part.status is ErrorCode.OFFSET_OUT_OF_RANGE:
            raise RequestError(416, "OFFSET_OUT_OF_RANGE", "offset", str(op.error), value=offset)
        if part.status is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            self.metadata.forget(key.topic)
            raise RequestError(
                404, "UNKNOWN_TOPIC_OR_PARTITION", "partition", str(op.error), value=key.partition
            )
        # A poll the shutdown drained is answered EXPIRED as it is: the clients the check would
        # ask are closing (CI once answered such a poll "client pool closed" instead).
        unanswered = op.outcome is Outcome.EXPIRED and not part.records
        if requested_offset is not None and unanswered and self.serving:
            return not self.metadata.offset_vouched(key, requested_offset)
        return False

    async def check_fetch_offset(self, op: DelayedFetch, budget_s: float | None = None) -> None:
        """416 unless the offset of an expired, empty fetch is in range (:meth:`fetch_finished`);
        a 503 once ``budget_s`` (default: one metadata call's deadline) has passed."""
        (part,) = op.parts
        timeout_s = self._metadata_timeout_s if budget_s is None else budget_s
        await self.metadata.check_offset_in_range(part.key, part.fetch_offset, timeout_s)

    def _clamped_wait_ms(self, requested: int | None) -> int:
        """``max_wait_ms`` within ``admission.max_wait_ms``: a long poll is answered by then at the latest.

        A clamp, not a refusal (Kafka's fetch may also answer before its max wait): the client
        gets what arrived and polls again. It bounds how long a waiter holds memory.
        """
        wait: int = self.settings.kafka.fetch_max_wait_ms if requested is None else requested
        limit: int = self.settings.admission.max_wait_ms  # typed: sections are Any to mypy
        return min(wait, limit)

    async def produce(self, topic: str, request: ProduceRequest) -> DelayedProduce:
        """Produce the records (``acks=all``, idempotent); the finished operation once each has its
        delivery report, or at ``timeout_ms`` with the ones not reported ``REQUEST_TIMED_OUT``."""
        count = await self.partitions(topic)
        records = producer_records(topic, request, count, self.message_max_bytes)
        with self._admitted():
            # Watched first, then sent (KafkaPurgatory.produce_async): a refusal sends nothing.
            return await self.kafka.produce_async(records, delay_ms=request.timeout_ms)

    async def await_replicated(
        self,
        topic: str,
        offsets: dict[int, int],
        timeout_ms: int | None,
        leader_epochs: dict[int, int] | None = None,
        records: dict[int, tuple[RecordIdentity, ...]] | None = None,
    ) -> DelayedReplication:
        """Wait until every in-sync replica holds ``offsets`` (partition → offset someone appended).

        ``leader_epochs`` (partition → the leader epoch the offset was appended in) fences: a
        leader change since is answered NOT_LEADER_OR_FOLLOWER. ``records`` (partition → the
        identities of the first and last record appended there, with the epochs) adds a read-back:
        another record at one of their offsets is NOT_LEADER_OR_FOLLOWER. A wait that moves to
        another instance takes both along.
        """
        count = await self.partitions(topic)
        for partition in offsets:
            if partition >= count:
                raise unknown_partition(topic, count, partition, "offsets")
        targets = {TopicPartitionKey(topic, p): o for p, o in offsets.items()}
        wait_ms = timeout_ms if timeout_ms is not None else self.settings.kafka.produce_timeout_ms
        for key, offset in targets.items():
            # The feed's high watermark when it follows the key, else one ListOffsets (shared).
            high = await self.metadata.high_watermark(key)
            if unreachable_offset(offset, high, wait_ms):
                raise RequestError(
                    416,
                    "OFFSET_OUT_OF_RANGE",
                    "offsets",
                    f"offset {offset} of {key.label} is past the log end (high watermark {high}): "
                    f"no append reaches it within {wait_ms} ms",
                    value=offset,
                )
        if leader_epochs is None:
            return await self._wait_replicated(targets, timeout_ms)
        epochs = {TopicPartitionKey(topic, p): e for p, e in leader_epochs.items()}
        if records is None:
            return await self._wait_replicated(Appended(targets, epochs), timeout_ms)
        identities = {TopicPartitionKey(topic, p): r for p, r in records.items()}
        return await self._wait_replicated(Appended(targets, epochs, identities, self.reader), timeout_ms)

    async def _wait_replicated(
        self, appended: Appended | dict[TopicPartitionKey, int], timeout_ms: int | None
    ) -> DelayedReplication:
        # Records are read back before NONE, never on the loop (OffLoopReplication).
        op = (OffLoopReplication if self.scaleout is None else OwnedReplication)(
            self.feed,
            appended,
            delay_ms=timeout_ms,
            loop_thread=threading.get_ident(),
            attempts=self._attempts,
        )
        if self.scaleout is not None:
            self.scaleout.place(op)
        await self._watch(op)
        return op

    async def _watch(self, op: DelayedFetch | DelayedReplication) -> Outcome:
        with self._admitted():
            # In the purgatory of its kind (fetch or produce); the partition was checked already.
            outcome = await self.kafka.watch(op, validate=False)
        return outcome

    @contextmanager
    def _admitted(self) -> Iterator[None]:
        """Admission around a submission: refusals (full, shutting down) become the client's answer."""
        if not self.serving:
            raise RequestError(503, "SHUTTING_DOWN", None, "the service is shutting down")
        admission = self.settings.admission
        pending = self.waiting_requests()
        try:
            if pending >= admission.max_waiters:
                # The whole process's budget (memory is bounded by it): refused before anything
                # is built into the purgatory. The loop thread submits one at a time, so no overshoot.
                raise PurgatoryFullError("service", pending, admission.max_waiters)
            yield
        except PurgatoryFullError as exc:
            # Never a silent expiry: the client hears at once that it should come back.
            raise RequestError(
                429,
                "PURGATORY_FULL",
                None,
                str(exc),
                headers={"Retry-After": str(admission.retry_after_s)},
            ) from None
        except PurgatoryClosedError:
            raise RequestError(503, "SHUTTING_DOWN", None, "the service is shutting down") from None
