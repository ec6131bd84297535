"""The streams of an HTTP/2 session: a waiting long poll (:class:`H2Waiter`, the operation's
callback) and a request still arriving (:class:`H2Request`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....kafka import DelayedFetch
from .._endpoint import PollWaits

if TYPE_CHECKING:
    from ._long_poll import H2Session

__all__ = ["H2Request", "H2Waiter"]


class H2Waiter:
    """One waiting long poll on a stream; the operation's callback (no closure, no task)."""

    __slots__ = ("gateway", "handle", "offset", "op", "partition", "session", "stream_id", "topic")

    def __init__(
        self,
        session: H2Session,
        stream_id: int,
        gateway: PollWaits,
        topic: str,
        partition: int,
        offset: int | None,
    ) -> None:
        self.session = session
        self.stream_id = stream_id
        self.gateway = gateway
        self.topic = topic
        self.partition = partition
        self.offset = offset  # the offset asked for (None: the high watermark), for the answer's checks
        self.handle: object = None  # the gateway's waiter, once fetch_then_call returned it
        self.op: DelayedFetch | None = None  # the finished operation whose answer is this stream's

    def __call__(self, op: DelayedFetch) -> None:
        """The operation finished (on the loop: at once, or from the handoff's batch)."""
        session = self.session
        self.op = op
        if session.waiters.get(self.stream_id) is self:
            # Answered with the others the same drain finished on this connection (H2Session.answer_finished).
            session.finished.append(self)
            if not session._answer_scheduled:
                session._answer_scheduled = True
                session.loop.call_soon(session.answer_finished)
        elif self.handle is None:
            # Finished inside fetch_then_call, before the session recorded the waiter.
            session.loop.call_soon(session.answer_if_waiting, self)


class H2Request:
    """A stream whose request is still arriving: its header fields and body so far."""

    __slots__ = ("body", "headers", "refused", "started")

    def __init__(self, headers: list[tuple[bytes, bytes]], started: float) -> None:
        self.headers = headers
        self.body = bytearray()
        self.refused = False  # answered 413 already: the rest of its body is dropped
        self.started = started  # the loop's time its HEADERS arrived (it has body_read_timeout_ms to end)
