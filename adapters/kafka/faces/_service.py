"""KafkaPurgatory: purgatories, their change feed, and the clients, wired for a service.

``KafkaPurgatory.connect(settings)`` builds a :class:`ClusterView`, a :class:`ChangeFeed`, a
:class:`RecordSender` (the idempotent producer behind produces) and a :class:`RecordReader`, and
starts the feed (no Kafka request until
work arrives). Each kind of operation gets its own purgatory, named as the broker names its
purgatories (``produce``, ``fetch``, ``commit``, ``topic_ready``, ``delete_records``: the
``delayedOperation`` label of the metrics), created on first use.

asyncio (never blocks the event loop; results are frozen dataclasses)::

    async with KafkaPurgatory.connect(settings) as kp:          # an AsyncKafkaPurgatory
        await kp.create_topic("orders", partitions=3)
        produced = await kp.produce([ProducerRecord("orders", b"...")])   # ProduceResult
        fetched = await kp.fetch({TopicPartitionKey("orders", 0): 0})     # FetchResult
        done = await kp.wait_committed("billing", {TopicPartitionKey("orders", 0): 42}, 30_000)

Threads (each call returns the submitted operation; ``op.wait(s)``, then ``op.result()``)::

    with KafkaPurgatory.connect(settings) as kp:
        op = kp.produce([ProducerRecord("orders", b"...")])
        op.wait(30) and op.result().succeeded

Kafka-side conditions are answered in the result, never raised (``_results.py``): submission
checks the operation's partitions first (one DescribeTopics), and a topic or partition that does
not exist is answered ``UNKNOWN_TOPIC_OR_PARTITION`` at once, without a wait — except for
``DelayedTopicReady``, whose point is to wait for a topic to appear. A check that cannot reach
Kafka concludes nothing: the operation waits, and answers ``KAFKA_UNAVAILABLE`` if Kafka stays
silent until its deadline. Exceptions are for the caller's mistakes: bad arguments, a
:class:`KafkaPurgatory` already closed.

Shutdown: :meth:`KafkaPurgatory.stop` (the start of ``close``, ``aclose``, leaving ``async with``)
answers every pending operation at once with ``SHUTTING_DOWN`` (in-flight produces first get
up to ``SHUTDOWN_FLUSH_S`` for their real delivery reports), and operations submitted between
then and the end of ``close`` are answered ``SHUTTING_DOWN`` too. A server that waits for its
requests before running the application's shutdown (uvicorn's graceful shutdown) would wait for
the purgatory's waits in full: :meth:`KafkaPurgatory.drain_on_signals` starts the drain when the
signal arrives instead (README, "In your own service").

``connect(shared_reads=True)`` reads records through a :class:`SharedReadReader` (one Kafka
read answers every long poll on the same range; the push feed's tail fills it): the HTTP
service's ``Gateway`` is built that way on this class, its only wiring of Kafka clients.

``connect`` also applies the settings a process-wide library would otherwise leave to the
caller: logging (``log.level``, ``log.format``; unless structlog is already configured), the
Prometheus collector (when ``prometheus-client`` is installed; ``purgatory.metrics``), and the
journal (``journal.enabled``).

A produce is sent through the idempotent producer (``acks=all``) and held in the ``produce``
purgatory until each record's delivery report came (:class:`DelayedProduce`); waiting for offsets
someone else appended is :class:`DelayedReplication`, in the ``replication`` purgatory.

Concurrency contract: all methods are thread-safe; the async ones never block the event loop:
their blocking Kafka calls (validation, admin requests) run on the purgatory's own
bounded pool (:class:`KafkaCalls`), never the loop's default executor, each awaited with its
deadline; ``aclose`` (which closes that pool) drains on the default executor.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from types import FrameType, TracebackType
from typing import Any, Self, TypeVar

import structlog

from purgatory import DelayedOperationPurgatory, Outcome, PurgatoryClosedError
from purgatory._loop_handoff import handoff_for
from purgatory.journal import Journal
from purgatory.settings import ConfigError, Settings, load_settings

from .._metrics import register_kafka_metrics, track_feed, untrack_feed
from ..clients._admin import BROKER_DEFAULT, create_topic, delete_records
from ..clients._calls import KafkaCalls
from ..clients._clients import ProducerRecord, RecordReader
from ..clients._errors import InvalidOffsetError, KafkaAdapterError, KafkaUnavailableError, UnknownTopicError
from ..clients._sender import DEFAULT_LINGER_MS, RecordSender, produce_one
from ..facts._feed import ChangeFeed
from ..facts._keys import GroupPartitionKey, TopicKey, TopicPartitionKey
from ..facts._record_cache import SharedReadReader
from ..facts._view import ClusterView
from ..ops._fetch import DEFAULT_FETCH_MAX_BYTES, DelayedFetch
from ..ops._metadata_waits import DelayedConsumerCommit, DelayedDeleteRecords, DelayedTopicReady
from ..ops._operations import KafkaOperation, draining
from ..ops._produce import DelayedProduce
from ..ops._replication import DelayedReplication
from ..ops._results import (
    CommitResult,
    DeleteRecordsResult,
    ErrorCode,
    FetchResult,
    ProduceResult,
    TopicReadyResult,
)
from ..reply._reply_router import DEFAULT_REPLY_PARTITIONS, ReplyRouter
from ..reply._request import DelayedRequest, RequestResult
from ..settings import KafkaSettings

__all__ = ["PURGATORY_NAMES", "AsyncKafkaPurgatory", "KafkaPurgatory"]

Op = TypeVar("Op", bound=KafkaOperation)

# One purgatory per kind of operation, as the broker keeps one per request type ("Produce",
# "Fetch", "DeleteRecords"...): each gets its own delayedOperation label, timer and limits
# (settings [purgatories.<name>]). Any other KafkaOperation goes to the purgatory named by
# connect(name=...).
PURGATORY_NAMES: dict[type[KafkaOperation], str] = {
    DelayedProduce: "produce",
    DelayedReplication: "replication",
    DelayedFetch: "fetch",
    DelayedConsumerCommit: "commit",
    DelayedTopicReady: "topic_ready",
    DelayedDeleteRecords: "delete_records",
}
ADMIN_TIMEOUT_S = 30.0  # CreateTopics / DeleteRecords: a metadata round trip and the controller's work
# The async methods' pool: threads blocked at most a client timeout each, and the calls admitted.
ASYNC_CALL_THREADS, ASYNC_CALL_BACKLOG = 4, 1024
# Request-reply (issue 14): the reply topic of an instance group unless replies(topic=) names one,
# and the wait of a request that gives no timeout_ms.
DEFAULT_REPLY_TOPIC = "purgatory-replies"
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
REPLY_READY_TIMEOUT_S = 30.0  # first request: create the reply topic, join its group, position the tail
REQUEST_PURGATORY = "request"  # the delayedOperation label of requests waiting for replies
# At stop(), produces already handed to librdkafka get this long for their real delivery reports
# before the rest answer SHUTTING_DOWN: half of the 1 s in which every waiter is answered, and a
# delivered record answered as delivered is one a client will not send again.
SHUTDOWN_FLUSH_S = 0.5
# What drain_on_signals() listens to by default: what uvicorn, gunicorn and Kubernetes send.
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_Missing = tuple[list[TopicPartitionKey], UnknownTopicError]  # partitions that do not exist, and why
_SignalHandler = Callable[[int, FrameType | None], Any] | int | None


def _configure_logging(settings: Settings) -> None:
    # A library must not override logging its host configured; it applies log.* only when nobody did.
    if not structlog.is_configured():
        from purgatory import configure_logging

        # force: configure_logging's own once-flag may be set by an earlier configuration that
        # was reset since (structlog.reset_defaults); unconfigured structlog is what counts.
        configure_logging(settings.log.level, settings.log.format, force=True)


def _register_metrics() -> None:
    try:
        from purgatory.metrics import register_metrics
    except ImportError:  # the metrics extra is not installed: nothing to export to
        return
    register_metrics()
    register_kafka_metrics()  # answers per status, feed health (adapters/kafka/_metrics.py)


class KafkaPurgatory:
    """Kafka-backed purgatories completed by one change feed (see the module docstring).

    Build with :meth:`connect`. ``with`` closes it; ``async with`` yields its
    :class:`AsyncKafkaPurgatory` face and closes it without blocking the loop.

    Attributes:
        settings: the :class:`KafkaSettings` in use.
        feed: the :class:`ChangeFeed` (a :class:`FactSource`): operations read their facts from
            it; build your own ``KafkaOperation(kp.feed, ...)`` and :meth:`submit` it.
        view: the :class:`ClusterView` the feed polls (batched admin requests).
        sender: the idempotent producer (``acks=all``, a :class:`RecordSender`) behind
            :meth:`produce`; its delivery reports complete each :class:`DelayedProduce`.
        calls: the bounded :class:`KafkaCalls` pool the async methods run blocking calls on.
        reader: the :class:`RecordReader` behind :meth:`fetch` (a :class:`SharedReadReader` with
            ``connect(shared_reads=True)``).
        journal: the operation :class:`Journal` when ``journal.enabled``, else ``None``.
        purgatories: the purgatories created so far, by name (one per kind of operation).
        purgatory: the purgatory of operations of any other kind (named by ``connect(name=)``).
        aio: the :class:`AsyncKafkaPurgatory` face of this object.
    """

    def __init__(
        self,
        feed: ChangeFeed,
        sender: RecordSender,
        reader: RecordReader,
        *,
        settings: Settings | None = None,
        name: str = "kafka",
        purgatory: DelayedOperationPurgatory[Any] | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.feed = feed
        self.view = feed.view
        self.sender = sender
        self.reader = reader
        self.calls = KafkaCalls(f"purgatory-{name}", ASYNC_CALL_THREADS, ASYNC_CALL_BACKLOG)
        self.settings = feed.settings
        self.journal = journal
        self.name = name
        self._full_settings = settings
        self._shared = purgatory  # given by the caller: every kind uses it, and it stays theirs
        self._purgatories: dict[str, DelayedOperationPurgatory[Any]] = {}
        self._lock = threading.Lock()
        self._closed = False  # stop() ran: no purgatory is created any more
        self._clients_closed = False  # close() ran
        self._stopped = threading.Event()  # stop()'s drain is over (a second stop() waits for it)
        self._close_done = False  # close() returned: later calls are the caller's mistake
        self._stopper: threading.Thread | None = None  # begin_shutdown()'s thread
        # drain_on_signals(): signal -> (our handler, the handler it chains to).
        self._signal_handlers: dict[int, tuple[Callable[[int, FrameType | None], None], _SignalHandler]] = {}
        self._redeliver: int | None = None  # a signal whose default action follows the drain
        self._router: ReplyRouter | None = None  # request-reply: built by replies() or the first request
        # The purgatory of each operation type seen: purgatory_for runs per request (a walk of
        # the type's MRO and a lock otherwise). A purgatory once created stays (close() shuts
        # it, never swaps it), so an entry never goes stale.
        self._by_type: dict[type[KafkaOperation], DelayedOperationPurgatory[Any]] = {}
        if purgatory is not None:
            self._adopt(purgatory)
        self.aio = AsyncKafkaPurgatory(self)
        track_feed(self)  # feed health exported while open (purgatory_kafka_feed_*)

    @classmethod
    def connect(
        cls,
        settings: Settings | KafkaSettings | None = None,
        *,
        bootstrap_servers: str | None = None,
        name: str = "kafka",
        purgatory: DelayedOperationPurgatory[Any] | None = None,
        configure_logging: bool = True,
        metrics: bool = True,
        shared_reads: bool = False,
    ) -> KafkaPurgatory:
        """Build everything and start the feed; cheap (clients connect on first use).

        ``settings``: full :class:`Settings` (default: :func:`load_settings`, i.e. environment
        and ``PURGATORY_CONFIG_FILE``) or just :class:`KafkaSettings`. ``purgatory``: use this
        one purgatory for every kind of operation (it is not shut down by :meth:`close`).
        ``configure_logging``: apply ``log.*`` unless structlog is configured already.
        ``metrics``: register the Prometheus collector (``prometheus-client`` installed).
        ``shared_reads``: read records through a :class:`SharedReadReader` (bounded memory, see
        its module), which the push feed's tail also fills; for many long polls per partition.
        """
        full = load_settings() if settings is None else settings if isinstance(settings, Settings) else None
        kafka = full.kafka if full is not None else settings
        assert isinstance(kafka, KafkaSettings)
        if not (bootstrap_servers or kafka.bootstrap_servers):
            raise ConfigError(
                "KafkaPurgatory needs a Kafka cluster: set PURGATORY_KAFKA_BOOTSTRAP (what `purgatory "
                "kafka up` prints) or kafka.bootstrap_servers, or pass bootstrap_servers="
            )
        if full is not None and configure_logging:
            _configure_logging(full)
        if metrics:
            _register_metrics()
        view = ClusterView(kafka, bootstrap_servers=bootstrap_servers)
        reader = (SharedReadReader if shared_reads else RecordReader)(
            kafka, bootstrap_servers=bootstrap_servers
        )
        # Long polls on one partition share their reads (one Kafka read answers them all), and
        # in push mode the feed's tail fills the shared reader with every watched partition's
        # new records. (No cache without shared_reads: nothing would read it.)
        shared = reader if isinstance(reader, SharedReadReader) else None
        feed = ChangeFeed(view, settings=kafka, name=name, records=shared)
        journal = None
        if full is not None and full.journal.enabled:
            from ..journal_sink import build_journal

            journal = build_journal(full, bootstrap_servers or kafka.bootstrap_servers)
        service = cls(
            feed,
            RecordSender(
                kafka,
                bootstrap_servers=bootstrap_servers,
                name=f"{name}-produce",
                linger_ms=kafka.produce_linger_ms,
                message_timeout_ms=kafka.produce_timeout_ms,
            ),
            reader,
            settings=full,
            name=name,
            purgatory=purgatory,
            journal=journal,
        )
        feed.start()
        return service

    # -- purgatories ----------------------------------------------------------------------------

    def _adopt(self, purgatory: DelayedOperationPurgatory[Any]) -> None:
        self._purgatories[purgatory.name] = purgatory
        self.feed.attach(purgatory)
        if self.journal is not None:
            self.journal.attach(purgatory)

    def _named(self, name: str) -> DelayedOperationPurgatory[Any]:
        if self._shared is not None:
            return self._shared
        with self._lock:
            purgatory = self._purgatories.get(name)
            if purgatory is None:
                if self._closed:
                    raise PurgatoryClosedError(f"KafkaPurgatory is closed: no purgatory {name!r}")
                if self._full_settings is not None:
                    purgatory = DelayedOperationPurgatory.from_settings(name, self._full_settings)
                else:
                    purgatory = DelayedOperationPurgatory(name)
                self._adopt(purgatory)
            return purgatory

    def _named_unlocked(self, name: str) -> DelayedOperationPurgatory[Any]:
        # _named() for a caller already holding self._lock (a threading.Lock: not re-entrant).
        if self._shared is not None:
            return self._shared
        purgatory = self._purgatories.get(name)
        if purgatory is None:
            if self._full_settings is not None:
                purgatory = DelayedOperationPurgatory.from_settings(name, self._full_settings)
            else:
                purgatory = DelayedOperationPurgatory(name)
            self._adopt(purgatory)
        return purgatory

    def purgatory_for(self, op: KafkaOperation) -> DelayedOperationPurgatory[Any]:
        """The purgatory ``op`` is held in: the one of its kind (:data:`PURGATORY_NAMES`)."""
        kind = type(op)
        purgatory = self._by_type.get(kind)
        if purgatory is None:
            purgatory = self._by_type[kind] = self.purgatory_for_kind(kind)
        return purgatory

    def purgatory_for_kind(self, kind: type[KafkaOperation]) -> DelayedOperationPurgatory[Any]:
        """The purgatory operations of ``kind`` (or of a subclass of it) are held in; created now
        if need be, so an owner can set it up (limits, listeners) before the first operation."""
        return self._named(self._name_for_kind(kind))

    @property
    def purgatory(self) -> DelayedOperationPurgatory[Any]:
        """The purgatory of operations of other kinds (named by ``connect(name=...)``)."""
        return self._named(self.name)

    @property
    def purgatories(self) -> dict[str, DelayedOperationPurgatory[Any]]:
        """The purgatories created so far, by name."""
        with self._lock:
            return dict(self._purgatories)

    # -- submission -----------------------------------------------------------------------------

    def _precheck(self, op: KafkaOperation) -> _Missing | None:
        """The operation's partitions Kafka says do not exist, with the error naming the first;
        None when every one exists or Kafka could not tell (one DescribeTopics request).

        Only Kafka's own "unknown topic" answer, or a partition past the topic's count, counts as
        missing: a cluster that did not answer concludes nothing (the operation then waits and
        says what it saw), so an outage is never reported as a missing topic.
        """
        if isinstance(op, DelayedTopicReady):
            return None  # waiting for the topic to appear is its point
        partitions: list[TopicPartitionKey] = []
        topics: set[str] = set()
        for key in op.watch_keys():
            if isinstance(key, TopicPartitionKey):
                partitions.append(key)
            elif isinstance(key, GroupPartitionKey):
                partitions.append(TopicPartitionKey(key.topic, key.partition))
            elif isinstance(key, TopicKey):
                topics.add(key.topic)
        topics.update(key.topic for key in partitions)
        if not topics:
            return None
        try:
            counts = self.view.partition_counts(topics)
        except KafkaAdapterError:
            return None  # not answered (or not an answer about existence): nothing to conclude

        def absent(key: TopicPartitionKey) -> bool:
            count = counts.get(key.topic, key.partition + 1)  # not in counts: nothing concluded
            return count is None or key.partition >= count

        missing = [key for key in partitions if absent(key)]
        missing_topics = sorted(t for t in topics if t in counts and counts[t] is None)
        if not missing and not missing_topics:
            return None
        first = missing[0] if missing else None
        detail = f"{type(op).__name__} answered UNKNOWN_TOPIC_OR_PARTITION at once"
        if first is None:
            error = UnknownTopicError(missing_topics[0], detail=detail)
        elif counts[first.topic] is None:
            error = UnknownTopicError(first.topic, detail=detail)
        else:
            error = UnknownTopicError(
                first.topic, first.partition, f"it has {counts[first.topic]} partitions; {detail}"
            )
        return missing, error

    def _refuse_unknown(self, op: KafkaOperation, refusal: _Missing) -> None:
        missing, error = refusal
        self._refuse(op, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error, missing or None)

    def _refuse(
        self,
        op: KafkaOperation,
        code: ErrorCode,
        error: KafkaAdapterError | None = None,
        keys: Iterable[TopicPartitionKey] | None = None,
    ) -> bool:
        """``op.refuse(...)`` for an operation never handed to a purgatory, and the journal told:
        no purgatory's listener sees such an answer, yet the caller got it (issue 28). True iff
        this call finished ``op`` (a no-op, unrecorded, if something answered it first)."""
        if not op.refuse(code, error, keys):
            return False
        journal = self.journal
        if journal is not None:
            journal.record_unsubmitted(self._name_for_kind(type(op)), op, op.watch_keys())
        return True

    def _name_for_kind(self, kind: type[KafkaOperation]) -> str:
        """The name of the purgatory ``kind`` is held in, without creating it."""
        if self._shared is not None:
            return self._shared.name
        for base in kind.__mro__:
            name = PURGATORY_NAMES.get(base)
            if name is not None:
                return name
        return self.name

    def _shutting_down(self, op: KafkaOperation) -> bool:
        """True (and ``op`` answered ``SHUTTING_DOWN``) iff stop() began and close() has not ended.

        Between the two a submission is not the caller's mistake but a request that raced the
        shutdown (a server still answering its last requests): it gets an answer, not an
        exception. After close() it is a closed object's misuse: ``PurgatoryClosedError``.
        """
        if not self._closed or self._close_done:
            return False
        self._refuse(op, ErrorCode.SHUTTING_DOWN)
        return True

    def submit(self, op: Op, *, validate: bool = True) -> Op:
        """Check the partitions exist, then ``try_complete_else_watch(op, op.watch_keys())`` in its
        purgatory; return ``op`` (finished at once when a partition does not exist, or when the
        purgatory is shutting down: see the module docstring)."""
        if self._shutting_down(op):
            return op
        if validate:
            refusal = self._precheck(op)
            if refusal is not None:
                self._refuse_unknown(op, refusal)
                return op
        try:
            purgatory = self.purgatory_for(op)
        except PurgatoryClosedError:
            if self._shutting_down(op):
                return op
            raise
        try:
            purgatory.try_complete_else_watch(op, op.watch_keys())
        except BaseException as exc:
            # Refused (PurgatoryFullError, closed, try_complete raised): make sure the feed does
            # not keep polling the op's keys (a no-op when the purgatory released them already).
            self.feed.on_finished(purgatory.name, op)
            if isinstance(exc, PurgatoryClosedError) and self._shutting_down(op):
                return op
            raise
        return op

    async def watch(self, op: Op, *, validate: bool = True) -> Outcome:
        """asyncio: submit and await the outcome (the partition check runs on ``self.calls``,
        bounded; skipped while the feed sees Kafka unreachable: it could conclude nothing)."""
        if self._shutting_down(op):
            return self._outcome(op)
        if validate and self.feed.unavailable is None:
            try:
                refusal = await self.calls.run(
                    self._precheck, op, timeout_s=self.view.request_timeout_s + 1.0, what="DescribeTopics"
                )
            except KafkaUnavailableError:
                refusal = None  # not answered in time (or the pool is full): the op waits and says so
            if refusal is not None:
                self._refuse_unknown(op, refusal)
                return self._outcome(op)
        try:
            purgatory = self.purgatory_for(op)
        except PurgatoryClosedError:
            if self._shutting_down(op):
                return self._outcome(op)
            raise
        try:
            return await purgatory.watch(op, op.watch_keys())
        except BaseException as exc:
            self.feed.on_finished(purgatory.name, op)  # as in submit(); a no-op once finished
            if isinstance(exc, PurgatoryClosedError) and self._shutting_down(op):
                return self._outcome(op)
            raise

    @staticmethod
    def _outcome(op: KafkaOperation) -> Outcome:
        outcome = op.outcome
        assert outcome is not None, f"{op!r} was answered without an outcome (refuse() finishes it)"
        return outcome

    def watch_then_call(
        self, op: Op, callback: Callable[[Op], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        """asyncio without a task: submit ``op`` (not validated); ``callback(op)`` on the loop once finished.

        See ``DelayedOperationPurgatory.watch_then_call`` (``loop``: the running loop, when the
        caller has it); the waiter gives up with ``purgatory_for(op).abandon(op)``.
        """
        purgatory = self.purgatory_for(op)
        try:
            purgatory.watch_then_call(op, op.watch_keys(), callback, loop)
        except BaseException:
            self.feed.on_finished(purgatory.name, op)  # as in submit(); a no-op once finished
            raise

    def _watch_then_call_or_refuse(
        self, op: Op, callback: Callable[[Op], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> bool:
        """:meth:`watch_then_call`, or False with ``op`` answered ``SHUTTING_DOWN`` (see there)."""
        if self._shutting_down(op):
            return False
        try:
            self.watch_then_call(op, callback, loop)
        except PurgatoryClosedError:
            if self._shutting_down(op):
                return False
            raise
        return True

    def produce(self, records: Iterable[ProducerRecord], *, delay_ms: int | None = None) -> DelayedProduce:
        """Send ``records`` through the idempotent producer (``acks=all``) and hold a
        :class:`DelayedProduce` until each has its delivery report (or ``delay_ms`` passed).

        Watched first, then sent: a refusal of the submission (``PurgatoryFullError``, closed)
        sends nothing, and a delivery report always finds the operation watched.
        """
        op = DelayedProduce(self.feed, records, delay_ms=delay_ms)
        self.submit(op, validate=False)
        if not op.shutting_down:  # answered SHUTTING_DOWN at submission: nothing is sent
            self._send(op)
        return op

    async def produce_async(
        self, records: Iterable[ProducerRecord], *, delay_ms: int | None = None
    ) -> DelayedProduce:
        """asyncio: :meth:`produce`, awaited; queueing never blocks the loop (librdkafka sends).

        Cancelling the awaiting task finishes the operation ``CANCELLED``; records already
        queued are still delivered (nothing takes back a sent record).
        """
        op = DelayedProduce(self.feed, records, delay_ms=delay_ms)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        op._mailbox = handoff_for(loop)  # reports are applied on this loop (DelayedProduce.delivered)

        def finished(_: DelayedProduce) -> None:
            if not future.done():
                future.set_result(None)

        if not self._watch_then_call_or_refuse(op, finished, loop):
            return op  # answered SHUTTING_DOWN: nothing was sent
        self._send(op)
        try:
            await future
        except asyncio.CancelledError:
            self.purgatory_for(op).abandon(op)
            raise
        return op

    def _send(self, op: DelayedProduce) -> None:
        """Queue ``op``'s records in order, each with ``op.delivered`` as its delivery callback.

        The op is watched on its key before this runs, so the report that counts the last
        record down finds it there (``check_and_complete``). A record the producer refuses at
        once (queue full, too large, unknown partition) is reported failed now, and so are the
        records after it, unsent: a request's records are never written out of order around a
        gap the client did not ask for.

        Straight to librdkafka, one ``functools.partial`` per record as the callback: this runs
        on the caller's event loop for every record (``purgatory bench produce``: the sender's
        per-record objects and closures were a sixth of the loop thread's time).
        """
        purgatory = self.purgatory_for(op)
        op._purgatory = purgatory
        producer = self.sender.producer()
        delivered = op.delivered
        sent = 0
        for index, record in enumerate(op.records):
            try:
                produce_one(
                    producer,
                    record.topic,
                    record.value,
                    record.key,
                    record.partition,
                    record.headers,
                    functools.partial(delivered, index),
                )
            except KafkaAdapterError as error:
                last = False
                for rest in range(index, len(op.records)):
                    last |= op.report(rest, error, None)
                if last:  # every record is reported now: this is the key event
                    purgatory.check_and_complete(op.key)
                break
            sent += 1
        self.sender.stats.sent += sent

    def fetch(self, fetch_offsets: Mapping[TopicPartitionKey, int], **options: Any) -> DelayedFetch:
        """Submit a long poll :class:`DelayedFetch` (min_records, min_bytes, max_bytes, max_wait_ms)."""
        return self.submit(DelayedFetch(self.feed, self.reader, fetch_offsets, **options))

    async def fetch_async(
        self, fetch_offsets: Mapping[TopicPartitionKey, int], **options: Any
    ) -> DelayedFetch:
        """asyncio: submit a long poll and await it; the finished op."""
        op = DelayedFetch(self.feed, self.reader, fetch_offsets, **options)
        await self.watch(op)
        return op

    def commit_barrier(
        self, group: str, targets: Mapping[TopicPartitionKey, int], timeout_ms: int | None = None
    ) -> DelayedConsumerCommit:
        """Submit a :class:`DelayedConsumerCommit`: done once ``group`` committed at least ``targets``."""
        return self.submit(DelayedConsumerCommit(self.feed, group, targets, delay_ms=timeout_ms))

    def topic_ready(self, topic: str, timeout_ms: int | None = None) -> DelayedTopicReady:
        """Submit a :class:`DelayedTopicReady`: done once ``topic`` exists with a leader per partition."""
        return self.submit(DelayedTopicReady(self.feed, topic, delay_ms=timeout_ms))

    def delete_records(
        self, before: Mapping[TopicPartitionKey, int], timeout_ms: int | None = None
    ) -> DelayedDeleteRecords:
        """Issue DeleteRecords (everything before ``before[partition]``), then hold a
        :class:`DelayedDeleteRecords` until the log start offsets show it."""
        op = DelayedDeleteRecords(self.feed, before, delay_ms=timeout_ms)
        if self._issue_delete(op):
            self.submit(op, validate=False)
        return op

    def _issue_delete(self, op: DelayedDeleteRecords) -> bool:
        """Send DeleteRecords for ``op``; False when ``op`` was answered instead (nothing to wait for).

        A partition that does not exist is answered before anything is deleted; Kafka's refusal
        or silence becomes the statuses (DeleteRecords is idempotent: asking again is safe).
        """
        if self._shutting_down(op):
            return False
        refusal = self._precheck(op)
        if refusal is not None:
            self._refuse_unknown(op, refusal)
            return False
        try:
            # Bounded by the operation's own timeout too: the caller asked for an answer by then.
            delete_records(self.view.admin, op.targets, timeout_s=min(ADMIN_TIMEOUT_S, op.delay_ms / 1000.0))
        except UnknownTopicError as exc:
            self._refuse(op, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, exc)
        except InvalidOffsetError as exc:
            self._refuse(op, ErrorCode.OFFSET_OUT_OF_RANGE, exc)
        except KafkaUnavailableError as exc:
            self._refuse(op, ErrorCode.KAFKA_UNAVAILABLE, exc)
        except KafkaAdapterError as exc:
            self._refuse(op, ErrorCode.UNKNOWN_SERVER_ERROR, exc)
        else:
            return True
        return False

    def create_topic(
        self,
        topic: str,
        *,
        partitions: int = BROKER_DEFAULT,
        replication_factor: int = BROKER_DEFAULT,
        config: Mapping[str, str] | None = None,
    ) -> bool:
        """Create ``topic`` (broker defaults for what is not given); False if it already existed.

        Returns when the controller accepted it; wait for leaders with :meth:`topic_ready`
        (``AsyncKafkaPurgatory.create_topic`` does both).
        """
        return create_topic(
            self.view.admin,
            topic,
            partitions=partitions,
            replication_factor=replication_factor,
            config=config,
            timeout_s=ADMIN_TIMEOUT_S,
        )

    # -- request-reply (issue 14; docs/design.md §9) --------------------------------------------

    def replies(
        self,
        topic: str | None = None,
        *,
        group: str | None = None,
        partitions: int = DEFAULT_REPLY_PARTITIONS,
        replication_factor: int = BROKER_DEFAULT,
        linger_ms: int = DEFAULT_LINGER_MS,
    ) -> ReplyRouter:
        """The :class:`ReplyRouter` of this instance; the first call configures it (not started).

        ``topic``: the reply topic shared by the instance group (created if missing with
        ``partitions``). ``group``: the consumer group the instances split its partitions
        through (scale-out ownership); None: this instance reads every partition. Later calls
        return the same router and must not ask for another one.
        """
        with self._lock:
            if self._router is None:
                if self._closed:
                    raise PurgatoryClosedError("KafkaPurgatory is closed: no request-reply")
                self._router = ReplyRouter(
                    self.settings,
                    self._named_unlocked(REQUEST_PURGATORY),
                    self.view.admin,
                    topic=topic or DEFAULT_REPLY_TOPIC,
                    group=group,
                    partitions=partitions,
                    replication_factor=replication_factor,
                    bootstrap_servers=self.view.bootstrap_servers,
                    name=self.name,
                    linger_ms=linger_ms,
                )
            elif (topic is not None and topic != self._router.topic) or (
                group is not None and group != self._router.group
            ):
                raise ValueError(
                    f"request-reply already uses topic {self._router.topic!r} (group {self._router.group!r})"
                )
            return self._router

    def _started_router(self) -> ReplyRouter:
        # The first request starts request-reply: reply topic, group join, the tail's position.
        # That setup is bounded on its own (REPLY_READY_TIMEOUT_S), not by the request's timeout.
        router = self.replies().start()
        if not router.ready():
            router.wait_ready(REPLY_READY_TIMEOUT_S)
        return router

    def request(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        timeout_ms: int | None = None,
        replies: int = 1,
        partial: bool = False,
    ) -> DelayedRequest:
        """Send a request to ``topic`` and hold a :class:`DelayedRequest` until its replies arrive.

        Threads: returns the submitted operation; ``op.wait(s)``, then ``op.result()`` (a
        :class:`RequestResult`, or :class:`RequestTimeoutError` with the replies that arrived).
        ``replies=N`` waits for N distinct responders; ``partial=True`` answers a deadline with
        what arrived instead of raising. See :meth:`AsyncKafkaPurgatory.request`.
        """
        timeout = DEFAULT_REQUEST_TIMEOUT_MS if timeout_ms is None else timeout_ms
        router = self._started_router()
        op = router.prepare(topic, timeout_ms=timeout, replies=replies, partial=partial)
        self._watch_then_send(
            router, op, value, key, lambda: router.purgatory.try_complete_else_watch(op, op.watch_keys())
        )
        return op

    @staticmethod
    def _watch_then_send(
        router: ReplyRouter,
        op: DelayedRequest,
        value: bytes | None,
        key: bytes | None,
        watch: Callable[[], Any],
    ) -> None:
        """Submit ``op`` (``watch``), then produce its request record: both faces' one order.

        Watched first, then sent, as :meth:`produce` does. A submission the purgatory refuses
        (full, closing) raises before anything is produced: no responder works on a request
        nobody waits for, and the caller's error is the only outcome. Once the record is sent,
        its replies and its delivery failure find the operation watched. (Sent first would be
        safe for replies alone — ``prepare`` registers the operation with the router, and a reply
        offered before the watch is kept on it for the first ``try_complete`` — but a refusal
        after the send leaves a request in Kafka that responders answer into the void.)
        """
        try:
            watch()
        except BaseException as exc:
            op.fail(
                KafkaAdapterError(f"request to {op.topic!r} was not submitted: {exc!r}")
            )  # no-op if finished
            raise
        router.send(op, value, key)  # fails op itself if the record is refused or undelivered

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self, *, drain: bool = True) -> None:
        """Answer every pending operation now, then stop the feed; the clients stay open.

        ``drain``: every operation still held finishes at once (``EXPIRED``, its undecided
        partitions ``SHUTTING_DOWN``; none is lost, nobody hangs), produces already sent after
        at most ``SHUTDOWN_FLUSH_S`` of delivery reports; ``drain=False`` is Kafka's behaviour:
        they are left unexecuted. Operations submitted from now until :meth:`close` returns are
        answered ``SHUTTING_DOWN``. :meth:`close` starts with this; an owner with workers of its
        own that may still read through the clients (the HTTP service's fetch attempts) calls it
        first, waits for them, then calls :meth:`close`. Blocks while operations drain (well
        under a second; a second caller waits for the first). Idempotent.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
            purgatories = list(self._purgatories.values())
        if not first:
            # Another thread drains (begin_shutdown): close() must not close the clients under it.
            self._stopped.wait()
            return
        try:
            produce_name = PURGATORY_NAMES[DelayedProduce]
            ordered = sorted(purgatories, key=lambda p: p.name == produce_name)  # produce last
            for purgatory in ordered:
                self.feed.detach(purgatory)
                if purgatory is self._shared:
                    continue
                if drain and purgatory.name == produce_name and purgatory.num_delayed():
                    # Reports served by the flush complete the produces they finish, as delivered.
                    self.sender.flush(SHUTDOWN_FLUSH_S)
                with draining():  # drained here, on this thread: answered SHUTTING_DOWN
                    purgatory.shutdown(drain=drain)
            # Only now: the feed's thread may be inside a Kafka request for up to the request
            # timeout, and the callers must not wait for it to be answered.
            self.feed.stop()
        finally:
            self._stopped.set()

    def begin_shutdown(self) -> None:
        """Start :meth:`stop` on a thread of its own and return at once; idempotent.

        What :meth:`drain_on_signals` calls when the signal comes: the waiting callers are
        answered ``SHUTTING_DOWN`` while the server is still finishing its requests.
        """
        with self._lock:
            if self._closed or self._stopper is not None:
                return
            self._stopper = threading.Thread(
                target=self._stop_then_redeliver, name=f"purgatory-{self.name}-stop"
            )
        self._stopper.start()

    def _stop_then_redeliver(self) -> None:
        self.stop()
        signum = self._redeliver
        if signum is not None:
            os.kill(os.getpid(), signum)  # its default action, restored by the handler: after the drain

    def drain_on_signals(self, signals: Iterable[int] = DRAIN_SIGNALS) -> bool:
        """On each of ``signals`` start the drain (:meth:`begin_shutdown`), then run the handler
        that was installed before (uvicorn's, which begins its graceful shutdown).

        Call it from the main thread once the server runs — in a FastAPI lifespan, after
        ``connect()`` — so it chains to the server's handlers. Why: uvicorn waits for the
        in-flight requests before it runs the lifespan's shutdown, so without this the callers
        waiting in the purgatory are answered only at their own timeout (or cancelled, a 500,
        past ``--timeout-graceful-shutdown``). With it they get ``SHUTTING_DOWN`` within a second
        of the signal. A signal whose handler was the default one (no server) is delivered again
        with its default action once the drain is over. :meth:`close` puts the handlers back
        (when called on the main thread; ``aclose`` is).

        Returns False, installing nothing, off the main thread, where Python delivers no signal
        (an application run by a test client's thread): the lifespan code stays the same there.
        """
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for signum in signals:
            previous: _SignalHandler = signal.getsignal(signum)
            handler = self._signal_handler(loop, previous)
            signal.signal(signum, handler)
            self._signal_handlers[signum] = (handler, previous)
        return True

    def _signal_handler(
        self, loop: asyncio.AbstractEventLoop | None, previous: _SignalHandler
    ) -> Callable[[int, FrameType | None], None]:
        def handler(signum: int, frame: FrameType | None) -> None:
            # Runs on the main thread between two bytecodes, possibly while that thread holds one
            # of our locks: it only hands the work over. call_soon_threadsafe is safe here (it
            # appends and writes the loop's self-pipe); without a loop, a thread start is.
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self.begin_shutdown)
            else:
                self.begin_shutdown()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                self._redeliver = signum

        return handler

    def _restore_signals(self) -> None:
        # Python lets only the main thread change handlers; close() off it leaves them (harmless:
        # a handler of a closed purgatory only chains to the previous one).
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, (handler, previous) in list(self._signal_handlers.items()):
            if signal.getsignal(signum) is handler:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._signal_handlers[signum]

    def close(self) -> None:
        """Answer the pending operations (:meth:`stop`), flush the journal, close the clients.

        Every operation still held is answered within a second (``SHUTTING_DOWN``; none is lost);
        from asyncio use :meth:`aclose`. Idempotent.
        """
        self._restore_signals()
        self.stop()
        with self._lock:
            if self._clients_closed:
                return
            self._clients_closed = True
        try:
            if self._router is not None:  # after the drain: waiting requests expired, none is lost
                self._router.close()
            if self.journal is not None:
                self.journal.close()
            self.calls.close()
            self.sender.close()
            self.reader.close()
            self.view.close()
        finally:
            untrack_feed(self)
            self._close_done = True

    async def aclose(self) -> None:
        """:meth:`close` in the default executor: the event loop keeps serving while it drains."""
        self._restore_signals()  # on the loop's thread: the main one, where Python allows it
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _prepare_journal(self) -> None:
        if self.journal is None:
            return
        try:
            self.journal.prepare()  # a journal that cannot write fails here, not once per event
        except BaseException:
            self.close()  # the feed thread and clients must not outlive the failed start
            raise

    def __enter__(self) -> Self:
        self._prepare_journal()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> AsyncKafkaPurgatory:
        # Checking (or creating) the journal topic is a Kafka round trip: off the loop.
        await asyncio.get_running_loop().run_in_executor(None, self._prepare_journal)
        return self.aio

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


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
        op = DelayedFetch(
            self.sync.feed,
            self.sync.reader,
            fetch_offsets,
            min_records=min_records,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
        )
        await self.sync.watch(op)
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
