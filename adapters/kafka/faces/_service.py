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

The class is built from parts, a file each: submission (``_submission``: check, refuse, watch),
request-reply (``_request_reply``), the lifecycle (``_lifecycle``: stop, close, signals); its
asyncio face is :class:`AsyncKafkaPurgatory` (``_async``); shared defaults are in ``_defaults``.

Concurrency contract: all methods are thread-safe; the async ones never block the event loop:
their blocking Kafka calls (validation, admin requests) run on the purgatory's own
bounded pool (:class:`KafkaCalls`), never the loop's default executor, each awaited with its
deadline; ``aclose`` (which closes that pool) drains on the default executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any

import structlog

from purgatory import DelayedOperationPurgatory, PurgatoryClosedError
from purgatory._loop_handoff import handoff_for
from purgatory.journal import Journal
from purgatory.settings import ConfigError, Settings, load_settings

from .._metrics import register_kafka_metrics, track_feed
from ..clients._admin import BROKER_DEFAULT, create_topic, delete_records
from ..clients._calls import KafkaCalls
from ..clients._clients import ProducerRecord, RecordReader
from ..clients._errors import InvalidOffsetError, KafkaAdapterError, KafkaUnavailableError, UnknownTopicError
from ..clients._sender import RecordSender, produce_one
from ..facts._feed import ChangeFeed
from ..facts._keys import TopicPartitionKey
from ..facts._record_cache import SharedReadReader
from ..facts._view import ClusterView
from ..ops._fetch import DelayedFetch
from ..ops._metadata_waits import DelayedConsumerCommit, DelayedDeleteRecords, DelayedTopicReady
from ..ops._operations import KafkaOperation
from ..ops._produce import DelayedProduce
from ..ops._results import ErrorCode
from ..reply._reply_router import ReplyRouter
from ..settings import KafkaSettings
from ._async import AsyncKafkaPurgatory
from ._defaults import (
    ADMIN_TIMEOUT_S,
    ASYNC_CALL_BACKLOG,
    ASYNC_CALL_THREADS,
    PURGATORY_NAMES,
    _SignalHandler,
)
from ._lifecycle import _Lifecycle
from ._request_reply import _RequestReply
from ._submission import _Submission

__all__ = ["PURGATORY_NAMES", "AsyncKafkaPurgatory", "KafkaPurgatory"]


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


class KafkaPurgatory(_Lifecycle, _RequestReply, _Submission):
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
        gathered_max_bytes: int | None = None,
    ) -> KafkaPurgatory:
        """Build everything and start the feed; cheap (clients connect on first use).

        ``settings``: full :class:`Settings` (default: :func:`load_settings`, i.e. environment
        and ``PURGATORY_CONFIG_FILE``) or just :class:`KafkaSettings`. ``purgatory``: use this
        one purgatory for every kind of operation (it is not shut down by :meth:`close`).
        ``configure_logging``: apply ``log.*`` unless structlog is configured already.
        ``metrics``: register the Prometheus collector (``prometheus-client`` installed).
        ``shared_reads``: read records through a :class:`SharedReadReader` (bounded memory, see
        its module), which the push feed's tail also fills; for many long polls per partition.
        ``gathered_max_bytes`` (with ``shared_reads``): bound on the records fetches waiting for
        ``min_bytes`` hold, all together (``facts/_gathered.py``); a fetch whose next read would
        pass it is answered at once with what it has. ``None``: not bounded.
        """
        full = load_settings() if settings is None else settings if isinstance(settings, Settings) else None
        kafka = full.kafka if full is not None else settings
        assert isinstance(kafka, KafkaSettings)
        if not (bootstrap_servers or kafka.bootstrap_servers):
            raise ConfigError(
                "KafkaPurgatory needs a Kafka cluster: set PURGATORY_KAFKA_BOOTSTRAP (what `purgatory "
                "kafka up` prints) or kafka.bootstrap_servers, or pass bootstrap_servers="
            )
        if gathered_max_bytes is not None and not shared_reads:
            raise ValueError(
                "gathered_max_bytes bounds the shared reader's records: it needs shared_reads=True"
            )
        if full is not None and configure_logging:
            _configure_logging(full)
        if metrics:
            _register_metrics()
        view = ClusterView(kafka, bootstrap_servers=bootstrap_servers)
        reader = (
            SharedReadReader(
                kafka, bootstrap_servers=bootstrap_servers, gathered_max_bytes=gathered_max_bytes
            )
            if shared_reads
            else RecordReader(kafka, bootstrap_servers=bootstrap_servers)
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
            if self._closed and name not in self._purgatories:
                raise PurgatoryClosedError(f"KafkaPurgatory is closed: no purgatory {name!r}")
            return self._named_unlocked(name)

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
        op = DelayedFetch(self.feed, self.reader, fetch_offsets, **options)
        self.check_ends(op)
        return self.submit(op)

    async def fetch_async(
        self, fetch_offsets: Mapping[TopicPartitionKey, int], **options: Any
    ) -> DelayedFetch:
        """asyncio: submit a long poll and await it; the finished op."""
        op = DelayedFetch(self.feed, self.reader, fetch_offsets, **options)
        if op.past_the_facts():
            with contextlib.suppress(KafkaAdapterError):  # unanswered: the facts decide
                await self.calls.run(self.check_ends, op, timeout_s=ADMIN_TIMEOUT_S + 1.0, what="ListOffsets")
        await self.watch(op)
        return op

    def check_ends(self, op: DelayedFetch) -> None:
        """Ask Kafka the high watermarks of the partitions ``op`` fetches past the facts' end.

        A produce answered offset ``n``, then a fetch from ``n + 1`` (the log's end): the feed may
        not have reported the append yet, and the facts alone would answer
        ``OFFSET_OUT_OF_RANGE``. One ListOffsets, only for such partitions; if Kafka does not
        answer, the facts decide as before (:meth:`DelayedFetch.past_the_facts`).
        """
        keys = op.past_the_facts()
        if not keys:
            return
        try:
            op.checked_ends(self.view.high_watermarks(keys))
        except KafkaAdapterError:
            return

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
