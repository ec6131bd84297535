"""Responder: the answering side of request-reply — a consumer group that replies to each request.

::

    @responder("prices", group="pricer")
    def price(request: Request) -> bytes:
        return quote(request.value)

    with price.start(bootstrap_servers="127.0.0.1:9092"):   # a thread; or price.run() to block
        ...

The handler gets a :class:`Request` and returns the reply's value (``bytes`` or ``None``); an
``async def`` handler runs on an event loop of the responder's own thread. What it returns is
produced to the request's ``kafka_replyTopic`` / ``kafka_replyPartition`` with the request's
``kafka_correlationId`` and ``purgatory_replyFrom: <group>`` (N-of-M counts distinct groups: run
one group per answering service). A handler that raises sends an *error reply*
(``purgatory_error: <type>: <message>``); the requester raises :class:`ResponderError`.

At least once: requests are read by a normal consumer group (``group``; instances of the
responder share the load), and a request's offset is committed only after its reply was
acknowledged (idempotent producer, ``acks=all``). A responder that dies between reading a request
and that commit leaves it uncommitted; the group hands the partition to another member, which
answers it again. Replies may therefore repeat — the requester's purgatory keeps the first.
Every ``COMMIT_INTERVAL_S`` the loop commits (asynchronously) the positions it consumed when no
reply is in flight; under sustained load, where some reply always is, it takes a *checkpoint*
(the positions, and the number of replies sent before them) and commits it at a later interval,
once Kafka acknowledged every reply sent before it (:class:`_ReplyAcks`) — without stopping to
flush: a flush held every request behind a broker round trip (acks=all: the followers' fetch
too), the tail of the round trips with 3 brokers. Only a checkpoint still unacknowledged after
``COMMIT_MAX_DELAY_S`` makes it flush (``stats.flushes``); on a rebalance it flushes and commits
before giving partitions up.
A reply Kafka did not take (unavailable past the producer's retries) stops commits: the loop
rewinds to the last committed offsets (``seek``), so those requests are answered again — until
their deadline, after which they are skipped. A reply refused for good (its topic or partition
does not exist, too large) is not retried: counted ``unanswerable``.

Requests whose ``purgatory_deadlineMs`` has passed are skipped (counted, committed): nobody waits
for their answer. Requests without a reply topic are handled and not answered (fire and forget).

Concurrency contract: ``start``/``stop``/``run`` by the owner; the handler runs on the
responder thread (``kafka-responder-<group>``), one request at a time, in partition order.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from ..clients._config import client_config, redacted
from ..clients._errors import KafkaAdapterError, KafkaUnavailableError
from ..clients._sender import DEFAULT_LINGER_MS, RecordSender
from ..settings import KafkaSettings
from ._correlation import (
    CORRELATION_ID,
    DEADLINE_MS,
    ERROR,
    REPLY_FROM,
    REPLY_PARTITION,
    REPLY_TOPIC,
    Headers,
    ReplyAddress,
    decode_partition,
    header,
    headers_of,
)
from ._responder_commits import _Checkpoint, _CommitState, _ReplyAcks

__all__ = ["Handler", "Request", "Responder", "ResponderStats", "request_of", "responder"]

_log = structlog.get_logger("purgatory.kafka.responder")

POLL_S = 0.1  # an idle poll: how soon a stop is seen
BATCH = 500  # requests drained per round once one arrived
COMMIT_INTERVAL_S = 0.2  # commit at most this often: a crash repeats at most ~this much work
# A checkpoint whose replies are still not all acknowledged after this long (a broker slow to
# answer): the loop stops to flush. (A flush every interval stalled answering for a broker round
# trip five times a second; one every 2 s still put a stall in the p99 with 3 brokers.)
COMMIT_MAX_DELAY_S = 2.0
# The broker answers an idle fetch after this long; a request ends the wait at once. Low so that a
# request arriving just after an empty response is not held by librdkafka's fetch backoff.
FETCH_WAIT_MS = 10
FLUSH_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 35.0  # one flush and the consumer's close
DEFAULT_SESSION_TIMEOUT_MS = 10_000  # how long a crashed responder keeps its requests unanswered


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a handler sees it."""

    value: bytes | None
    key: bytes | None
    headers: Headers
    topic: str
    partition: int
    offset: int
    correlation_id: str | None
    reply_to: ReplyAddress | None
    deadline_ms: int | None  # epoch ms; None: the requester gave none
    # The record's timestamp (epoch ms): CreateTime, or the broker's LogAppendTime when the topic
    # says so (when the request was appended: request-reply's trace bench reads it). None: none.
    timestamp_ms: int | None = None


@dataclass
class ResponderStats:
    requests: int = 0
    answered: int = 0
    errors: int = 0  # handler raised: an error reply was sent
    expired: int = 0  # skipped: past their deadline
    unanswerable: int = 0  # no reply topic or correlation id: handled, not answered
    commits: int = 0
    flushes: int = 0  # commits that stopped answering to flush the replies (module doc)
    commit_failures: int = 0  # retried at the next interval
    rewinds: int = 0  # undelivered replies: re-read from the last commit


Handler = Callable[[Request], bytes | Awaitable[bytes | None] | None]


def _decode_int(raw: bytes | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def request_of(message: Message) -> Request:
    """Decode a request record (headers as :mod:`._correlation` describes them)."""
    headers = headers_of(message.headers())
    reply_topic = header(headers, REPLY_TOPIC)
    correlation = header(headers, CORRELATION_ID)
    return Request(
        value=message.value(),
        key=message.key(),
        headers=headers,
        topic=message.topic() or "",
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        correlation_id=None if correlation is None else correlation.decode("utf-8", "replace"),
        reply_to=(
            None
            if not reply_topic
            else ReplyAddress(
                reply_topic.decode("utf-8", "replace"), decode_partition(header(headers, REPLY_PARTITION))
            )
        ),
        deadline_ms=_decode_int(header(headers, DEADLINE_MS)),
        timestamp_ms=_timestamp_ms(message),
    )


def _timestamp_ms(message: Message) -> int | None:
    kind, value = message.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE else value


class Responder:
    """Answers the requests of ``topic`` in consumer group ``group`` with ``handler`` (module doc)."""

    def __init__(
        self,
        topic: str,
        handler: Handler,
        *,
        group: str,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        linger_ms: int = DEFAULT_LINGER_MS,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty string, got {topic!r}")
        if not isinstance(group, str) or not group:
            raise ValueError(f"group must be a non-empty string, got {group!r}")
        self.topic = topic
        self.handler = handler
        self.group = group
        self.session_timeout_ms = session_timeout_ms
        self.linger_ms = linger_ms
        self.stats = ResponderStats()
        self._is_async = inspect.iscoroutinefunction(handler)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.assigned = threading.Event()  # set once the group gave this member partitions

    def __call__(self, request: Request) -> Any:
        """The handler itself (a decorated function stays callable, e.g. in unit tests)."""
        return self.handler(request)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, settings: KafkaSettings | None = None, *, bootstrap_servers: str | None = None) -> Self:
        """Answer on a thread of its own until :meth:`stop` (``with responder.start(...):``)."""
        if self._thread is not None:
            raise RuntimeError(f"responder {self.group!r} of {self.topic!r} is already running")
        settings = settings or KafkaSettings()
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._guarded,
            args=(settings, bootstrap_servers),
            name=f"kafka-responder-{self.group}",
            daemon=True,
        )
        self._thread.start()
        return self

    def run(self, settings: KafkaSettings | None = None, *, bootstrap_servers: str | None = None) -> None:
        """Answer on the calling thread until :meth:`stop` (from another thread) or Ctrl-C."""
        self._loop(settings or KafkaSettings(), bootstrap_servers)

    def stop(self) -> None:
        """Finish the request in hand, flush its replies, commit, leave the group."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(JOIN_TIMEOUT_S)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the loop -------------------------------------------------------------------------------

    def _guarded(self, settings: KafkaSettings, bootstrap_servers: str | None) -> None:
        try:
            self._loop(settings, bootstrap_servers)
        except BaseException as exc:  # the thread's end is logged, not lost
            self._failure = exc
            _log.exception("responder_failed", group=self.group, topic=self.topic)

    def _loop(self, settings: KafkaSettings, bootstrap_servers: str | None) -> None:
        config: dict[str, Any] = {
            **client_config(settings, bootstrap_servers),
            "group.id": self.group,
            "enable.auto.commit": False,  # committed after the replies are acknowledged (module doc)
            "auto.offset.reset": "earliest",  # a new group answers what is waiting (stale ones skipped)
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": max(100, self.session_timeout_ms // 10),
            "partition.assignment.strategy": "cooperative-sticky",
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "socket.nagle.disable": True,
            "log_level": 0,
        }
        _log.debug("responder_connect", group=self.group, config=redacted(config))
        sender = RecordSender(
            settings,
            bootstrap_servers=bootstrap_servers,
            name=f"replies-{self.group}",
            linger_ms=self.linger_ms,
        )
        consumer = Consumer(config)
        loop = asyncio.new_event_loop() if self._is_async else None
        state = _CommitState()
        acks = _ReplyAcks()

        def flush_and_commit() -> None:
            state.checkpoint = None  # this commit covers it (or rewinds past it)
            if not state.dirty:
                return
            self.stats.flushes += 1
            remaining = sender.flush(FLUSH_TIMEOUT_S)
            if remaining or state.undelivered:
                # Not all replies are acknowledged: commit nothing, re-read from the last commit.
                self.stats.rewinds += 1
                _log.warning("responder_rewind", group=self.group, undelivered=state.undelivered + remaining)
                committed = consumer.committed(consumer.assignment(), timeout=FLUSH_TIMEOUT_S)
                for tp in committed:
                    consumer.seek(
                        TopicPartition(
                            tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                        )
                    )
                state.reset()
                return
            try:
                # Asynchronous, like the loop's other commits: a synchronous commit has no bound
                # (librdkafka holds it until a coordinator answers), so a coordinator that was
                # down or fenced held this thread — no request answered, the rebalance callback
                # unserved — for the whole outage (the chaos suite's seed 7: 14 s). The replies
                # are acknowledged already; a commit lost with the coordinator only repeats them.
                consumer.commit(asynchronous=True)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:  # nothing consumed: nothing to commit
                    # The coordinator moved or is down: keep the positions dirty and try again at
                    # the next interval (the replies are out; at worst their requests repeat).
                    self.stats.commit_failures += 1
                    state.since = time.monotonic()
                    _log.warning("responder_commit_failed", group=self.group, error=str(exc))
                    return
            self.stats.commits += 1
            state.reset()

        def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
            if partitions:
                self.assigned.set()

        def on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
            try:
                flush_and_commit()
            except Exception:  # the rebalance goes on; what was not committed is answered again
                _log.exception("responder_commit_on_revoke_failed", group=self.group)

        def on_lost(c: Consumer, partitions: list[TopicPartition]) -> None:
            # The session expired (no coordinator answered): the partitions are another member's
            # already, so there is nothing to commit for them; flushing here would only hold the
            # rejoin. What was not committed is answered again by the next owner.
            _log.warning("responder_partitions_lost", group=self.group, partitions=len(partitions))
            state.reset()

        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
        try:
            while not self._stopping.is_set():
                first = consumer.poll(POLL_S)
                messages = [] if first is None else [first, *consumer.consume(BATCH, 0)]
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            _log.warning("responder_consume_error", group=self.group, error=error.str())
                        continue
                    self._answer(message, sender, loop, state, acks)
                now = time.monotonic()
                if state.dirty and now - state.last_commit >= COMMIT_INTERVAL_S:
                    try:
                        self._commit_acknowledged(consumer, state, acks, now, flush_and_commit)
                    except Exception:  # an outage (committed() timed out): retry at the next interval
                        self.stats.commit_failures += 1
                        state.since = state.last_commit = time.monotonic()
                        _log.exception("responder_commit_failed", group=self.group)
            flush_and_commit()
        finally:
            consumer.close()  # leaves the group: the others take its partitions at once
            sender.close()
            if loop is not None:
                loop.close()

    def _commit_acknowledged(
        self,
        consumer: Consumer,
        state: _CommitState,
        acks: _ReplyAcks,
        now: float,
        flush_and_commit: Callable[[], None],
    ) -> None:
        """One commit step of the loop (module doc); waits for Kafka only for an overdue checkpoint."""
        state.last_commit = now
        # Read the acknowledgements before ``undelivered``: a failed reply counts itself
        # undelivered before it is reported, so a prefix that includes it is seen with it.
        all_reported = acks.reported_below(acks.sent)
        checkpoint = state.checkpoint
        checkpoint_reported = checkpoint is not None and acks.reported_below(checkpoint.replies)
        if state.undelivered:
            # A reply Kafka did not take: nothing past it may be committed; the flush rewinds.
            if now - state.since >= COMMIT_MAX_DELAY_S:
                flush_and_commit()
            return
        if all_reported:
            # Every reply so far is acknowledged: commit all positions (the same thread consumes,
            # so nothing was read since). Asynchronous: a lost commit is covered by the next.
            consumer.commit(asynchronous=True)
            self.stats.commits += 1
            state.reset()
            return
        if checkpoint is not None:
            if checkpoint_reported:
                consumer.commit(offsets=checkpoint.positions, asynchronous=True)
                self.stats.commits += 1
                state.since = checkpoint.taken  # what was read after it is still uncommitted
            elif now - checkpoint.taken >= COMMIT_MAX_DELAY_S:
                flush_and_commit()  # a broker slow to acknowledge: wait for it once
                return
            else:
                return
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        state.checkpoint = _Checkpoint(acks.sent, positions, now)

    def _answer(
        self,
        message: Message,
        sender: RecordSender,
        loop: asyncio.AbstractEventLoop | None,
        state: _CommitState,
        acks: _ReplyAcks,
    ) -> None:
        request = request_of(message)
        self.stats.requests += 1
        state.touch()
        if request.deadline_ms is not None and request.deadline_ms < time.time_ns() // 1_000_000:
            self.stats.expired += 1
            return
        headers: list[tuple[str, bytes]] = [(REPLY_FROM, self.group.encode())]
        try:
            result = self.handler(request)
            if loop is not None and inspect.isawaitable(result):
                result = loop.run_until_complete(result)
            value = result
            if value is not None and not isinstance(value, bytes | bytearray):
                raise TypeError(f"a handler returns bytes or None, got {type(value).__name__}")
        except Exception as exc:
            self.stats.errors += 1
            _log.warning("responder_handler_failed", group=self.group, offset=request.offset, error=repr(exc))
            value = None
            headers.append((ERROR, f"{type(exc).__name__}: {exc}".encode()))
        if request.reply_to is None or request.correlation_id is None:
            self.stats.unanswerable += 1
            return
        headers.append((CORRELATION_ID, request.correlation_id.encode()))

        seq = acks.next()

        def delivered(error: KafkaAdapterError | None, _message: Message | None) -> None:
            # On the sender thread (or this one, in a flush). Reported either way, so the
            # acknowledged prefix moves on; an unavailable one stops commits (rewind) first.
            if isinstance(error, KafkaUnavailableError):
                state.undelivered += 1  # Kafka did not take it: rewind, answer again (module doc)
            elif error is not None:
                # Refused for good (reply topic or partition gone, too large): answering again
                # would fail again, so it is not retried; the requester's deadline answers it.
                self.stats.unanswerable += 1
                _log.warning("responder_reply_refused", group=self.group, error=str(error))
            acks.reported(seq)

        try:
            sender.send(
                request.reply_to.topic,
                None if value is None else bytes(value),
                key=request.key,
                partition=request.reply_to.partition,
                headers=headers,
                on_delivery=delivered,
            )
        except KafkaAdapterError as exc:
            # Refused at once (a reply partition or topic that does not exist, a reply too
            # large): this request cannot be answered; the others still can.
            self.stats.unanswerable += 1
            _log.warning("responder_reply_refused", group=self.group, offset=request.offset, error=str(exc))
            acks.reported(seq)  # nothing was queued: nothing to wait for
            return
        self.stats.answered += 1


def responder(
    topic: str,
    *,
    group: str,
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
    linger_ms: int = DEFAULT_LINGER_MS,
) -> Callable[[Handler], Responder]:
    """Decorator: turn ``handler(request) -> bytes | None`` into a :class:`Responder` of ``topic``."""

    def wrap(handler: Handler) -> Responder:
        return Responder(
            topic, handler, group=group, session_timeout_ms=session_timeout_ms, linger_ms=linger_ms
        )

    return wrap
