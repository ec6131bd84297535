"""The state of an HTTP/1.1 connection whose long poll waits below the ASGI app.

:class:`Parked` is one waiting long poll and its answer while written; :class:`LazyFlowControl`
is uvicorn's flow control without an event per idle connection; :class:`PushbackConnection` is
h11's connection with a request head pushed back for uvicorn's own loop (what the fast path
does not take). Used by :class:`._long_poll.LongPollH11Protocol` only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ....kafka import DelayedFetch
from .._endpoint import PollWaits
from ._framing import StrictH11Connection

__all__ = ["LazyFlowControl", "Parked", "PushbackConnection"]


class PushbackConnection(StrictH11Connection):
    """h11's connection with one event pushed back: the protocol looks at a request head first,
    and what it does not take, uvicorn's own loop reads again as if untouched."""

    pushed_back: Any = None

    def next_event(self) -> Any:
        event = self.pushed_back
        if event is not None:
            self.pushed_back = None
            return event
        return super().next_event()


class Parked:
    """One waiting long poll: its waiter (the gateway's), then its finished operation, and what its
    answer needs.

    The topic and partition are the operation's key's (the gateway shares one key per partition
    between its waiters): not the request's own copies, held by every waiter.

    An answer larger than :data:`ANSWER_CHUNK` is written a chunk at a time (``answer``, ``sent``:
    see :meth:`LongPollH11Protocol._send`); the connection stays parked until its last byte left.
    A large 200 is its head (``head``, written at once) and the rendered body itself, shared.
    """

    __slots__ = (
        "answer",
        "close",
        "gateway",
        "head",
        "offset",
        "op",
        "pipelined",
        "sent",
        "target",
        "version",
        "waiter",
    )

    def __init__(
        self,
        gateway: PollWaits,
        waiter: object,
        offset: int | None,
        target: str | None,
        version: str = "1.1",
        *,
        close: bool = False,
    ) -> None:
        self.gateway = gateway  # its lifespan drops it from the app's state before draining
        self.waiter = waiter  # the gateway's, for abandon_fetch
        self.op: DelayedFetch | None = None  # the finished operation whose answer is this poll's
        self.offset = offset  # the offset asked for (None: the high watermark), for the answer's checks
        self.close = close  # the connection closes after the answer (Connection: close, HTTP/1.0)
        self.version = version  # the request's HTTP version, for the access log
        self.pipelined = b""  # bytes the client sent after the request, for h11 after the answer
        self.target = target  # path and query, for the access log only (None when it is off)
        self.answer: memoryview | None = None  # the answer's bytes while they are being written
        self.head: bytes | None = None  # a large 200's status line and headers, before ``answer``
        self.sent = 0  # of them, how many the transport took


class LazyFlowControl:
    """uvicorn's :class:`FlowControl`, slotted, whose ``asyncio.Event`` is made only once a write pauses.

    An idle connection never needs the event, and each cost ~760 bytes (the event and its
    waiters' deque) of every waiting long poll's connection; the instance dict of a subclass of
    :class:`FlowControl` ~200 more, so this is a class of its own with the same interface
    (uvicorn only calls these methods and reads ``write_paused``). Same behaviour: ``drain``
    returns at once while writing is not paused, else waits for ``resume_writing``.
    """

    __slots__ = ("_transport", "_writable", "read_paused", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:  # no Event: see the class docstring
        self._transport = transport
        self._writable: asyncio.Event | None = None
        self.read_paused = False
        self.write_paused = False

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()

    def _event(self) -> asyncio.Event:
        if self._writable is None:
            self._writable = asyncio.Event()
            if not self.write_paused:
                self._writable.set()
        return self._writable

    async def drain(self) -> None:
        if self.write_paused:
            await self._event().wait()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            self._event().clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self._event().set()
