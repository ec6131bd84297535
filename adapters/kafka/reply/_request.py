"""DelayedRequest: a request sent over Kafka, held in the purgatory until its replies arrive.

A request is Kafka's delayed operation in its plainest form: watched on one key (its
:class:`CorrelationKey`), completed when enough replies arrived, expired at its deadline. The
purgatory's finish claim makes the answer exactly-once however many copies of a reply come back
(an at-least-once responder may send one twice) and whichever comes first, reply or deadline.

Replies are *offered* to the operation by the :class:`ReplyRouter` (tail thread), which then calls
``check_and_complete(key)``; ``try_complete`` counts the distinct replies (:attr:`Reply.identity`:
one per responder group). An offered reply is kept on the operation, not in the purgatory, so
one that arrives before the operation is watched (the router registers the operation before the
request is produced) is found by the watch's first ``try_complete``.

Outcomes, as :meth:`DelayedRequest.result` reports them:

* COMPLETED with ``wanted`` replies → :class:`RequestResult` (``complete=True``);
* EXPIRED → :class:`RequestTimeoutError` carrying the replies that did arrive, or, with
  ``partial=True``, a :class:`RequestResult` with ``complete=False`` and those replies;
* failed before any reply (the request could not be produced) → that typed error;
* ``wanted == 1`` and the reply is an error reply → :class:`ResponderError`.

Concurrency contract: ``offer`` runs on the router's tail thread, under ``op.lock`` (so
``try_complete``, also under it, sees a consistent count); ``fail`` on any thread; ``result`` and
``wait`` once the operation finished (``done`` is set after ``on_complete``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from purgatory import DelayedOperation, Outcome
from purgatory._operation import LockLike

from .._metrics import ANSWERS
from ..clients._errors import KafkaAdapterError, KafkaUnavailableError
from ._correlation import CorrelationKey, Reply

__all__ = ["DelayedRequest", "RequestResult", "RequestTimeoutError", "ResponderError"]

# Guards the lazy creation of a request's completion event against on_complete setting it: held
# for a few bytecodes (as _operations._DONE_LOCK).
_DONE_LOCK = threading.Lock()


class RequestTimeoutError(KafkaAdapterError, TimeoutError):
    """The request's deadline passed before ``wanted`` replies arrived; ``replies`` holds those that did."""

    def __init__(
        self, topic: str, correlation_id: str, timeout_ms: int, wanted: int, replies: tuple[Reply, ...]
    ) -> None:
        super().__init__(
            f"request {correlation_id} to topic {topic!r}: {len(replies)} of {wanted} "
            f"repl{'y' if wanted == 1 else 'ies'} within {timeout_ms} ms"
        )
        self.topic = topic
        self.correlation_id = correlation_id
        self.timeout_ms = timeout_ms
        self.wanted = wanted
        self.replies = replies


class ResponderError(KafkaAdapterError):
    """The responder's handler raised: its error reply (``purgatory_error`` header) says what."""

    def __init__(self, topic: str, reply: Reply) -> None:
        super().__init__(f"responder {reply.responder or '?'} of topic {topic!r} failed: {reply.error}")
        self.topic = topic
        self.reply = reply


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What a request got back.

    Attributes:
        correlation_id: the request's id (its ``kafka_correlationId`` header).
        replies: the distinct replies, in arrival order.
        wanted: how many were asked for (``replies=N``).
        complete: True when ``wanted`` arrived; False for a partial answer at the deadline.
        latency_ms: from submission to the finish.
    """

    correlation_id: str
    replies: tuple[Reply, ...]
    wanted: int
    complete: bool
    latency_ms: float

    @property
    def reply(self) -> Reply:
        """The first reply (``replies=1``: the reply); IndexError when none arrived (partial)."""
        return self.replies[0]

    @property
    def value(self) -> bytes | None:
        """The first reply's value."""
        return self.reply.value


class DelayedRequest(DelayedOperation):
    """One request waiting for ``wanted`` distinct replies or its deadline (see the module doc).

    Attributes:
        key: its :class:`CorrelationKey` (the purgatory watch key).
        topic: the request topic.
        reply_partition: the reply partition named in its headers (None: any).
        wanted, partial, timeout_ms: as given to ``request()``.
        duplicates: copies of replies already counted (ignored), seen while it waited.
        error: the typed error that failed it early (the produce failed), or None.
        done: a ``threading.Event`` set once it finished (``wait(s)`` blocks on it).
    """

    def __init__(
        self,
        correlation_id: str,
        topic: str,
        *,
        timeout_ms: int,
        wanted: int = 1,
        partial: bool = False,
        reply_partition: int | None = None,
        on_finished: Callable[[DelayedRequest], None] | None = None,
    ) -> None:
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
            raise ValueError(f"replies must be an int >= 1, got {wanted!r}")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
            raise ValueError(f"timeout_ms must be an int >= 1, got {timeout_ms!r}")
        # A lock of its own, not the operation's default: ``offer`` takes ``op.lock`` from the
        # tail thread, and reading the default lock gives it a face that points back at the
        # operation — a reference cycle per request that only the cyclic GC frees (its
        # collections stalled the requester for tens to hundreds of ms on a busy machine).
        # (Re-entrant: ``fail`` holds it while its finish runs ``on_complete``, which takes it too.
        # The cast: typeshed's RLock.__exit__ is positional-only, LockLike's takes ``*exc``.)
        super().__init__(timeout_ms, cast(LockLike, threading.RLock()))
        self.key = CorrelationKey(correlation_id)
        self.topic = topic
        self.timeout_ms = timeout_ms
        self.wanted = wanted
        self.partial = partial
        self.reply_partition = reply_partition
        self.duplicates = 0
        self.error: KafkaAdapterError | None = None
        # Built on first use (threads' wait()); an awaited request never needs one (~1 KB each).
        self._done: threading.Event | None = None
        self._finished = False  # on_complete has run to its end (what done reports)
        self.created_ns = time.monotonic_ns()
        self.finished_ns = 0
        self._by_identity: dict[str, Reply] = {}
        self._final: tuple[Reply, ...] = ()
        self._failing: KafkaAdapterError | None = None
        self._on_finished = on_finished

    @property
    def done(self) -> threading.Event:
        """Set once the request finished (``on_complete`` ran)."""
        with _DONE_LOCK:  # against on_complete setting a just-created event too early or never
            if self._done is None:
                self._done = threading.Event()
                if self._finished:
                    self._done.set()
            return self._done

    @property
    def correlation_id(self) -> str:
        return self.key.correlation_id

    @property
    def requested_ns(self) -> int:
        """When ``request()`` was called (the journal's latency runs from here: AnsweredOperation)."""
        return self.created_ns

    def answer_code(self) -> str:
        """The caller's answer in one code, once finished (the journal's ``error_code``, the
        answers metric's ``status``): ``NONE`` for replies (or a partial result at the deadline),
        ``REQUEST_TIMED_OUT`` for an expiry that raises, ``RESPONDER_ERROR`` for a single reply
        carrying the responder's error, ``KAFKA_UNAVAILABLE`` or ``UNKNOWN_SERVER_ERROR`` for a
        request that failed before it was answered (its produce failed)."""
        if self.error is not None:
            unavailable = isinstance(self.error, KafkaUnavailableError)
            return "KAFKA_UNAVAILABLE" if unavailable else "UNKNOWN_SERVER_ERROR"
        if self.outcome is Outcome.COMPLETED:
            replies = self._final
            responder_failed = self.wanted == 1 and bool(replies) and replies[0].error is not None
            return "RESPONDER_ERROR" if responder_failed else "NONE"
        return "NONE" if self.partial else "REQUEST_TIMED_OUT"

    def watch_keys(self) -> tuple[CorrelationKey]:
        return (self.key,)

    def offer(self, reply: Reply) -> bool:
        """Keep ``reply`` if it is new (True); a copy of one kept, or one after the finish: False."""
        with self.lock:
            if self.is_completed() or reply.identity in self._by_identity:
                self.duplicates += 1
                return False
            self._by_identity[reply.identity] = reply
            return True

    def fail(self, error: KafkaAdapterError) -> bool:
        """Finish now with ``error`` (e.g. the request could not be produced); True iff this call did."""
        # Under op.lock so that on_complete can tell its claim came from here: a reply's finish
        # (try_complete, also under op.lock) cannot interleave, and an expiry's on_complete waits
        # for the lock in on_complete and then sees _failing cleared.
        with self.lock:
            self._failing = error
            try:
                return self.force_complete()
            finally:
                self._failing = None

    def try_complete(self) -> bool:
        return len(self._by_identity) >= self.wanted and self.force_complete()

    def on_complete(self) -> None:
        self.finished_ns = time.monotonic_ns()
        with self.lock:  # offers stop here: is_completed() is already True for any later offer
            self._final = tuple(self._by_identity.values())
            self.error = self._failing
        if self._on_finished is not None:
            self._on_finished(self)
        ANSWERS.count("DelayedRequest", self.answer_code())
        with _DONE_LOCK:
            self._finished = True
            if self._done is not None:
                self._done.set()

    def on_expiration(self) -> None:
        pass  # result() reports the expiry; the router counts it in on_finished

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until finished (threads); True if it has."""
        return self.done.wait(timeout_s)

    def result(self) -> RequestResult:
        """The answer once finished (see the module doc for what each outcome gives)."""
        outcome = self.outcome
        if outcome is None:
            raise RuntimeError(f"request {self.correlation_id} has not finished yet")
        if self.error is not None:
            raise self.error
        replies = self._final
        latency_ms = (self.finished_ns - self.created_ns) / 1e6
        if outcome is Outcome.COMPLETED:
            if self.wanted == 1 and replies[0].error is not None:
                raise ResponderError(self.topic, replies[0])
            return RequestResult(self.correlation_id, replies, self.wanted, True, latency_ms)
        if outcome is Outcome.EXPIRED and self.partial:
            return RequestResult(self.correlation_id, replies, self.wanted, False, latency_ms)
        raise RequestTimeoutError(self.topic, self.correlation_id, self.timeout_ms, self.wanted, replies)
