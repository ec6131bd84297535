"""Request-reply on a :class:`KafkaPurgatory`: its reply router and ``request`` (docs/design.md §9).

The first request starts the :class:`ReplyRouter` (reply topic, group join, the tail's position);
each request is watched in the ``request`` purgatory, then produced (``_watch_then_send``: the one
order of the sync and the async faces, and why).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from purgatory import DelayedOperationPurgatory, PurgatoryClosedError

from ..clients._admin import BROKER_DEFAULT
from ..clients._errors import KafkaAdapterError
from ..clients._sender import DEFAULT_LINGER_MS
from ..facts._view import ClusterView
from ..reply._reply_router import DEFAULT_REPLY_PARTITIONS, ReplyRouter
from ..reply._request import DelayedRequest
from ..settings import KafkaSettings
from ._defaults import (
    DEFAULT_REPLY_TOPIC,
    DEFAULT_REQUEST_TIMEOUT_MS,
    REPLY_READY_TIMEOUT_S,
    REQUEST_PURGATORY,
)

if TYPE_CHECKING:
    pass

__all__: list[str] = []


class _RequestReply:
    """Request-reply (a base of :class:`KafkaPurgatory`, which sets the state)."""

    _closed: bool
    _lock: threading.Lock
    _router: ReplyRouter | None
    name: str
    settings: KafkaSettings
    view: ClusterView

    if TYPE_CHECKING:  # defined by KafkaPurgatory or another of its bases

        def _named_unlocked(self, name: str) -> DelayedOperationPurgatory[Any]: ...

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
