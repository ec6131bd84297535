"""How an HTTP/2 session answers: its finished long polls in batches, any response through ``h2``
within the flow-control windows and the write backlog, and one ``transport.write`` per batch.

:class:`H2AnswerWriter` is the answering half of :class:`._long_poll.H2Session` (a mixin: the
session's state is one object; this module holds the methods that write). Why batches and shared
frames: see :meth:`H2AnswerWriter.answer_finished` and :mod:`._answers`.

Concurrency contract: the event loop's thread only, as the session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import h2.errors
import h2.exceptions
import structlog
from starlette.responses import JSONResponse, Response

from purgatory import Outcome

from ....kafka import DelayedFetch, ErrorCode
from ...answers._budget import HeldBodies
from ...answers._errors import UNEXPECTED_ERROR_BODY, RequestError
from ...answers._render import error_response, fetch_response
from ...answers._shared import SharedAnswers
from .._endpoint import LongPollEndpoint
from ..h1._wire import ANSWER_CHUNK
from ._answers import (
    MAX_SHARED_BODY,
    SharedAnswerFrames,
    SharedFrames,
    plain_answers_allowed,
    record_plain_stream,
)
from ._connection import H2ServerConnection
from ._limits import MAX_DATA_FRAME, WRITE_BACKLOG
from ._streams import H2Waiter

__all__ = ["H2AnswerWriter"]

_log = structlog.get_logger("purgatory.service")

_STATUS = {status: str(status).encode() for status in range(100, 600)}
_SHARED_FRAMES = SharedFrames()  # builds the operations' shared frames: one loop thread per process


class H2AnswerWriter:
    """The answering methods of :class:`._long_poll.H2Session` (see the module docstring)."""

    # The session's state these methods use (set in H2Session.__init__; see its docstring).
    protocol: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    conn: H2ServerConnection
    route: LongPollEndpoint | None
    rendered: SharedAnswers | None
    waiters: dict[int, H2Waiter]
    finished: list[H2Waiter]
    blocked: HeldBodies
    backlogged: bool
    read_paused: bool
    out: bytearray
    _flush_scheduled: bool
    _answer_scheduled: bool

    def _close_if_done(self) -> None:
        raise NotImplementedError  # the session's: GOAWAY and close once the last stream is answered

    def answer_finished(self) -> None:
        """Answer the waiters finished since the last call, then write them with one ``write``.

        Why one call for many: a key event finishes thousands of long polls, most with the same
        200. Answered one call chain each (the waiter, ``answer``, the frames lookup, the h2
        state, the frames' bytes), the calls were most of the loop's ~5 µs per answer (py-spy,
        10,000 streams); here the connection's checks are made once and the common answer is a
        loop over the list. Anything else (an error, an expired poll, a window too small, the
        connection's first header block) goes through :meth:`answer` and ``h2``, as before.
        """
        self._answer_scheduled = False
        finished, self.finished = self.finished, []
        waiters = self.waiters
        conn = self.conn
        plain = self._plain_possible()
        default_headers = self.protocol.server_state.default_headers
        streams = conn.streams
        answered = 0
        # Shared frames are copied into ``out``: past the write backlog, answers go through h2,
        # whose bodies wait in ``blocked`` (shared, counted in the answer budget) instead.
        room = WRITE_BACKLOG - self.transport.get_write_buffer_size()
        # The waiters of one coalesced group share their operation, so consecutive waiters mostly
        # have the same one: its frames (or None: not shareable) are looked up once per run.
        last_op: DelayedFetch | None = None
        frames: SharedAnswerFrames | None = None
        for waiter in finished:
            stream_id = waiter.stream_id
            if waiters.get(stream_id) is not waiter:
                continue  # the client reset the stream meanwhile: its op was cancelled
            try:
                op = waiter.op
                assert op is not None
                if op is not last_op:
                    last_op, frames = op, self._shared_frames(op, default_headers)
                if (
                    plain
                    and frames is not None
                    and len(self.out) < room
                    and record_plain_stream(conn, streams.get(stream_id), frames)
                ):
                    del waiters[stream_id]
                    # h2's own bytes first (a SETTINGS ack, an answer sent through it): in order.
                    if conn._data_to_send:  # read first: data_to_send() makes two objects when empty
                        self.out += conn.data_to_send()
                    frames.write_to(self.out, stream_id)
                    answered += 1
                    continue
                self.answer(waiter)
                if not plain:  # the connection's first header block may have gone out through h2 now
                    plain = self._plain_possible()
            except Exception:
                # A bug: this stream hears a 500 (as CatchAll answers one); the rest of the batch,
                # taken off the list already, must still be answered.
                if waiters.pop(stream_id, None) is waiter:
                    self._respond_with(stream_id, self._unexpected())
        _SHARED_FRAMES.answers += answered
        if answered and self.route is not None:
            self.route.count_answers(200, None, answered)
        self.flush()
        self._close_if_done()

    def _shared_frames(self, op: DelayedFetch, default_headers: Any) -> SharedAnswerFrames | None:
        """``op``'s answer as shared frames, or None when it is not a plain 200 that fits them."""
        part = op.parts[0]
        if not (op.outcome is Outcome.COMPLETED and op.error is None and part.status is ErrorCode.NONE):
            return None
        assert self.rendered is not None
        key = part.key
        answer = self.rendered.of(key.topic, key.partition, op)  # one per operation
        # A larger body goes through h2, a frame at a time (a frame's length has 24 bits, and a
        # body past 16 MiB made every such answer a 500).
        if len(answer.body) > MAX_SHARED_BODY:
            return None
        frames: SharedAnswerFrames = answer.http2(default_headers, _SHARED_FRAMES.frames_for)
        return frames

    def _plain_possible(self) -> bool:
        """Whether this connection's answers may be the shared frames (their stream's state aside)."""
        if self.rendered is None or self.transport.is_closing():
            return False
        return plain_answers_allowed(self.conn)

    def answer_if_waiting(self, waiter: H2Waiter) -> None:
        if self.waiters.get(waiter.stream_id) is waiter:
            self.finished.append(waiter)
            self.answer_finished()

    def answer(self, waiter: H2Waiter) -> None:
        """Answer a finished waiter through ``h2``, as the route does (and as the HTTP/1.1 fast path does)."""
        del self.waiters[waiter.stream_id]
        op = waiter.op
        assert op is not None
        if self.transport.is_closing():
            return
        try:
            if waiter.gateway.fetch_finished(op, waiter.offset):
                # An expired, empty poll whose offset the feed cannot vouch for: one ListOffsets.
                task = self.loop.create_task(self._answer_after_offset_check(waiter, op))
                self.protocol.tasks.add(task)
                task.add_done_callback(self.protocol.tasks.discard)
                return
            response = self._fetch_response(waiter, op)
        except Exception as exc:
            response = self._failure_response(exc)
        self._respond_with(waiter.stream_id, response)

    async def _answer_after_offset_check(self, waiter: H2Waiter, op: DelayedFetch) -> None:
        try:
            await waiter.gateway.check_fetch_offset(op)
            response = self._fetch_response(waiter, op)
        except Exception as exc:
            response = self._failure_response(exc)
        self._respond_with(waiter.stream_id, response)

    def _failure_response(self, exc: Exception) -> Response:
        """The answer when rendering one failed: a refusal's own, else (a bug) as :meth:`_unexpected`.

        Called inside the ``except`` block, so the bug's log line carries its traceback.
        """
        if isinstance(exc, RequestError):
            return error_response(exc)
        return self._unexpected()

    def _fetch_response(self, waiter: H2Waiter, op: DelayedFetch) -> Response:
        assert self.route is not None
        response = fetch_response(self.route.rendered, waiter.topic, waiter.partition, op)
        body = response.body
        if len(body) > ANSWER_CHUNK:  # may wait in ``blocked`` for the client: within the answer budget
            waiter.gateway.check_answer_fits(bytes(body))
        return response

    def _unexpected(self) -> Response:
        """As the app's catch-all (``CatchAll``): a bug answered as a JSON 500, counted, logged."""
        assert self.route is not None
        self.route.count_unexpected_error()
        _log.exception("request_failed_unexpectedly", method="GET", fast_path=True, http_version="2")
        return JSONResponse(UNEXPECTED_ERROR_BODY, status_code=500)

    def _respond_with(self, stream_id: int, response: Response) -> None:
        if self.route is not None:  # answered below the app: counted here, not by CountAnswers
            self.route.count_answers(response.status_code, response.body)
        self._respond(stream_id, response.status_code, response.raw_headers, bytes(response.body))

    def _respond(
        self, stream_id: int, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes
    ) -> None:
        if self.transport.is_closing():
            return
        block = [(b":status", _STATUS[status]), *self.protocol.server_state.default_headers, *headers]
        try:
            self.conn.send_headers(stream_id, block, end_stream=not body)
            if body:
                self._send_body(stream_id, memoryview(body), body)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self.blocked.pop(stream_id, None)  # the client reset the stream meanwhile
        self._schedule_flush()

    def _backlog(self) -> int:
        """Bytes written but not sent yet: the transport's buffer, ours, and h2's."""
        return self.transport.get_write_buffer_size() + len(self.out) + len(self.conn._data_to_send)

    def _send_body(self, stream_id: int, view: memoryview, whole: bytes | None = None) -> None:
        """Send what the windows and the backlog allow; the rest waits in ``blocked`` for a
        WINDOW_UPDATE, or for the transport to drain (:data:`WRITE_BACKLOG`)."""
        conn = self.conn
        while view:
            if self._backlog() >= WRITE_BACKLOG:
                self.blocked[stream_id] = view
                self.backlogged = True
                return
            # At most MAX_DATA_FRAME a frame, whatever frame size the client allows: each frame
            # is a copy, and the backlog is checked between frames.
            size = min(
                conn.local_flow_control_window(stream_id),
                conn.max_outbound_frame_size,
                MAX_DATA_FRAME,
                len(view),
            )
            if size <= 0:
                self.blocked[stream_id] = view
                return
            last = size == len(view)
            # The shared body itself when it fits in one frame (the common answer): no copy.
            chunk = whole if last and whole is not None and size == len(whole) else bytes(view[:size])
            conn.send_data(stream_id, chunk, end_stream=last)
            view = view[size:]
        self.blocked.pop(stream_id, None)

    def _unblock(self, stream_id: int) -> None:
        streams = list(self.blocked) if stream_id == 0 else [stream_id]
        for sid in streams:
            # Left in ``blocked``: _send_body re-blocks or pops it (the same body: no budget work).
            view = self.blocked.get(sid)
            if view is None:
                continue
            try:
                self._send_body(sid, view)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                self.blocked.pop(sid, None)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        # One write per connection for all answers of a batch wake-up (the batch runs in one
        # loop iteration; the flush after it).
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_later)

    def _flush_later(self) -> None:
        self._flush_scheduled = False
        self.flush()
        self._close_if_done()

    def flush(self) -> None:
        out = self.out
        out += self.conn.data_to_send()
        if out:
            self.out = bytearray()
            if not self.transport.is_closing():
                self.transport.write(out)
        if self.backlogged and not self.protocol.flow.write_paused:
            # The transport took the backlog without pausing (so no resume_writing will come):
            # send on in the next iteration, after the loop's other work.
            self.backlogged = False
            self.loop.call_soon(self._unblock, 0)

    def writing_resumed(self) -> None:
        """The transport's buffer drained (resume_writing): reading goes on if the backlog paused
        it, and streams held back by the backlog go on."""
        if self.read_paused:
            self.read_paused = False
            self.protocol.flow.resume_reading()
        if self.backlogged:
            self.backlogged = False
            self._unblock(0)

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        try:
            self.conn.reset_stream(stream_id, code)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            return
        self._schedule_flush()
