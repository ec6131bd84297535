"""LongPollH11Protocol: the long-poll route served below the ASGI app, a waiter without a task.

Through uvicorn and Starlette a waiting long poll is an asyncio task with a chain of ~20
coroutines, and its answer wakes the task, unwinds the chain, passes two ASGI messages through
the middlewares' send wrappers and h11's state machine, and makes two writes: ~23 KB and ~110 µs
per waiter (``purgatory bench fanout``, docs/performance.md). Here, once h11 has parsed a request
head, a ``GET /topics/{t}/partitions/{p}/records`` is taken by the protocol itself:

* checked with the ASGI path's own code, through the app's endpoint the server handed to this
  class (:class:`..._endpoint.LongPollEndpoint`: this module imports nothing of the app) — the
  header limits, the :class:`Authenticator` its middleware asks, the very Starlette route it
  matches, the topic policy, the partition, the query, and ``gateway.fetch_then_call``
  (admission and its 429, the ``max_wait_ms`` clamp, the same operation);
* parked: the connection's protocol holds the operation; nothing else waits (no task, no future);
* answered from the batch wake-up (:class:`LoopHandoff`): the callback takes the answer of the
  finished operation from the route's :class:`...answers._shared.SharedAnswers` (rendered once
  per operation — equal long polls share one — with the whole response's bytes) and writes it
  in one call.

Anything else — another route, a refusal (4xx), a request this path does not take (a body,
``Expect``, an upgrade, proxy headers, metadata or the high watermark not cached yet, scale-out)
— is handed back to h11 untouched and goes through the ASGI app as before, which gives the
refusal its answer. So the answers are the same bytes either way (tests/service/test_long_poll.py
compares them).

A long poll that closes its connection — ``Connection: close``, or HTTP/1.0 (which h11 never
keeps alive, ``Connection: keep-alive`` or not) — is taken too: answered as h11 answers it (the
same bytes plus ``Connection: close``), then the connection is closed. What the client sent
after such a request is not served (RFC 9112 §9.6: the server closes after that response).

Kept from the hardened server: the head's size (h11) and time bounds (this is a
:class:`HeadTimeoutH11Protocol`), TLS (in the transport, below any protocol), keep-alive (the
connection reads its next request after the answer; h11 starts afresh with any pipelined bytes),
a client that disconnects while waiting (its operation is finished CANCELLED at once, out of the
timer and the watch lists, as the ASGI path's disconnect watcher does), and graceful shutdown (a
parked waiter is answered by the drain, then the connection closes).

The response bytes are written here, not through h11: after a response the connection holds no
h11 state until the next request's bytes arrive (then a fresh one; at once if the client
pipelined bytes after the request), and its keep-alive and head timeouts share one loop timer
with the other answers of the burst (:mod:`._coalesced_timers`). What h11 would
have written for the same response — status line, uvicorn's default headers, the response's
headers, body — is what :func:`http11_response` writes.

Concurrency contract: as uvicorn's protocols, everything runs on the event loop's thread; the
operation may finish on any thread, and its callback reaches the loop through the handoff.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast
from urllib.parse import unquote

import h11
import structlog
from starlette.responses import JSONResponse, Response
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.utils import get_path_with_query_string

from ....kafka import DelayedFetch
from ...answers._errors import UNEXPECTED_ERROR_BODY, RequestError
from ...answers._render import error_response, fetch_body_response
from .._endpoint import LongPollEndpoint
from .._fanout_writes import fanout_writes
from ._burst import answer_burst
from ._coalesced_timers import coalesced_timers
from ._head_timeout import HeadTimeoutH11Protocol
from ._parked import LazyFlowControl, Parked, PushbackConnection
from ._sse import hand_over_stream
from ._wire import ANSWER_CHUNK, http11_head, http11_ok, http11_response

__all__ = ["LongPollH11Protocol", "http11_response", "long_poll_protocol"]

_log = structlog.get_logger("purgatory.service")


class LongPollH11Protocol(HeadTimeoutH11Protocol):
    """:class:`HeadTimeoutH11Protocol` serving the long-poll route itself (module docstring).

    Per-connection state is one attribute, ``_parked``, set only while a long poll waits: uvicorn's
    protocol already has ~27 instance attributes, and past 30 names CPython stops sharing the
    instance dictionaries' keys — 1.6 KB more per connection, measured. While parked the
    connection holds no h11 state either (``conn`` is None; bytes a client sends meanwhile wait in
    the parked record, reading paused), nor after its answer until the next bytes arrive
    (:meth:`_ensure_conn`, called wherever uvicorn's code would read ``conn``).
    """

    _parked: Parked | None = None
    _closing = False  # shutdown asked while parked: close after the answer (set on the instance)
    # The app's endpoint, handed over by the server that made this class (long_poll_protocol, or
    # LongPollHttp from the lifespan state): None, every request goes through the app.
    endpoint: LongPollEndpoint | None = None
    # The service's protocols say so to the app, whose lifespan warns when it runs without them.
    serves_fast_paths = True

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._route is not None:
            self.conn = self._fresh_connection()
            self.flow = cast(FlowControl, LazyFlowControl(transport))

    @property
    def _route(self) -> LongPollEndpoint | None:
        endpoint = self.endpoint
        return endpoint if endpoint is not None and endpoint.serves_long_polls else None

    # -- h11 events ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        parked = self._parked
        if parked is not None:
            # The next request, pipelined before this answer: h11 would buffer it and uvicorn
            # pause reading; kept here until the answer hands it to a fresh h11 state (dropped
            # if the connection closes after the answer: not served).
            if not parked.close:
                parked.pipelined += data
            self.flow.pause_reading()
            return
        self._ensure_conn()  # the next request after an answer (see _respond)
        super().data_received(data)

    def handle_events(self) -> None:
        conn = self.conn
        if conn.their_state is not h11.IDLE or conn.our_state is not h11.IDLE or self._route is None:
            super().handle_events()
            return
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            super().handle_events()  # h11 raises it again there: uvicorn's 400
            return
        if isinstance(event, h11.Request) and self._taken(event):
            if self._parked is not None:  # else an event stream took the connection over (._sse)
                self._park_connection()
            return
        assert isinstance(conn, PushbackConnection)
        conn.pushed_back = event
        super().handle_events()

    def _park_connection(self) -> None:
        """The request is parked: read its end, keep what follows it, and let go of h11's state."""
        parked = self._parked
        assert parked is not None
        self._unset_keepalive_if_required()
        self._disarm_head_timer()  # the whole head arrived
        if parked.close:
            # EndOfMessage of the GET. h11 now expects the connection's end: what the client sent
            # after this request is not served (RFC 9112 §9.6), so it is not read at all.
            self.conn.next_event()
            self.flow.pause_reading()
            self.conn = None  # type: ignore[assignment]
            return
        while True:
            # EndOfMessage of the GET (no body: _take refused any framing of one), then NEED_DATA,
            # or PAUSED if more bytes came with it: a pipelined request, read after the answer.
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                break
            if event is h11.PAUSED:
                parked.pipelined = self.conn.trailing_data[0]
                self.flow.pause_reading()  # as uvicorn: the next request waits for this answer
                break
        self.conn = None  # type: ignore[assignment]  # no h11 state while waiting (class docstring)

    def _taken(self, event: h11.Request) -> bool:
        try:
            return self._take(event)
        except Exception:  # a bug: the ASGI path answers the request instead (and may count it)
            _log.exception("long_poll_take_failed", target=event.target[:200])
            return False

    def _take(self, event: h11.Request) -> bool:
        """Park ``event`` if it is a long poll this path serves (module docstring); else False."""
        route = self._route
        assert route is not None
        version = event.http_version
        if event.method != b"GET" or version not in (b"1.1", b"1.0"):
            return False
        headers = [(name.lower(), value) for name, value in event.headers]
        if not route.plain_get_headers(headers):
            return False
        # h11's rule for keeping a connection alive: HTTP/1.1 without "close" in Connection.
        close = version == b"1.0" or any(
            name == b"connection" and b"close" in _tokens(value) for name, value in headers
        )
        raw_path, _, query_string = event.target.partition(b"?")
        try:
            path = unquote(raw_path.decode("ascii"))
        except UnicodeDecodeError:
            return False
        scope: dict[str, Any] = {
            "type": "http",
            "method": "GET",
            "root_path": self.root_path,
            "path": self.root_path + path,
            "query_string": query_string,
            "headers": headers,
            "scheme": self.scheme,
        }
        if path.endswith("/stream"):
            return hand_over_stream(self, route, scope)  # the connection is the stream's (._sse)
        poll = route.checked_poll(scope)
        if poll is None:
            return False
        gateway, topic, partition, params = poll
        try:
            waiter = gateway.fetch_then_call(topic, partition, params, self._finished)
        except RequestError:
            return False  # admission's 429 or a 503: the ASGI path answers it, with the same checks
        if waiter is None:
            return False  # nothing was submitted: fetch() awaits what is not cached
        logged = self.access_log and self.access_logger.isEnabledFor(logging.INFO)
        target = get_path_with_query_string(scope) if logged else None  # type: ignore[arg-type]
        http_version = "1.0" if version == b"1.0" else "1.1"  # interned: no string per waiter
        self._parked = Parked(gateway, waiter, params.offset, target, http_version, close=close)
        return True

    # -- the answer ----------------------------------------------------------------------------

    def _finished(self, op: DelayedFetch) -> None:
        """The operation finished (on the loop: at once, or from the handoff's batch)."""
        parked = self._parked
        if parked is None or parked.op is not None:
            if parked is None and not self._parked_conn_gone() and self.conn.our_state is h11.SEND_RESPONSE:
                # Finished inside fetch_then_call, before _take parked it: answered once parked.
                self.loop.call_soon(self._answer_early, op)
            return
        parked.op = op
        answer_burst(self.loop).add(self)  # written with the burst's others, or alone if not plain (._burst)

    def _answer_early(self, op: DelayedFetch) -> None:
        parked = self._parked
        if parked is not None and parked.op is None:
            parked.op = op
            self._answer(parked)

    def _answer(self, parked: Parked) -> None:
        if self.transport.is_closing():
            return  # the client left: connection_lost lets go of it
        try:
            assert parked.op is not None, "answered once its operation finished"
            if parked.gateway.fetch_finished(parked.op, parked.offset):
                # An expired, empty poll whose offset the feed cannot vouch for: one ListOffsets
                # (rare: as the ASGI path, which awaits it). A task only for this one answer.
                task = self.loop.create_task(self._answer_after_offset_check(parked))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
                return
            head, data = self._fetch_answer(parked)
        except RequestError as exc:
            head, data = None, self._error_answer(error_response(exc), parked)
        except Exception:
            head, data = None, self._error_answer(self._unexpected(parked), parked)
        self._respond(parked, data, head)

    def _plain_answer(self, parked: Parked) -> bytes | None:
        """The 200 of ``parked``'s finished operation as one write of shared bytes — what a burst
        writes (._burst) — or None when it is anything else (an error, an offset to check, a body
        past one write): then :meth:`_answer` answers it."""
        assert parked.op is not None, "answered once its operation finished"
        try:
            if parked.gateway.fetch_finished(parked.op, parked.offset):
                return None
            head, data = self._fetch_answer(parked)
        except Exception:
            return None  # _answer meets it again and answers it (a 4xx, or a 500 for a bug)
        return data if head is None else None

    async def _answer_after_offset_check(self, parked: Parked) -> None:
        try:
            assert parked.op is not None, "answered once its operation finished"
            await parked.gateway.check_fetch_offset(parked.op)
            head, data = self._fetch_answer(parked)
        except RequestError as exc:
            head, data = None, self._error_answer(error_response(exc), parked)
        except Exception:
            head, data = None, self._error_answer(self._unexpected(parked), parked)
        if self._parked is parked and not self.transport.is_closing():
            self._respond(parked, data, head)

    def _fetch_answer(self, parked: Parked) -> tuple[bytes | None, bytes]:
        """The 200, as the route renders it: (None, its bytes) — the operation's shared answer,
        encoded once for the waiters answered with it — or, for a body past one write, (its head,
        the rendered body itself), the body held while written piece by piece: within the budget."""
        route = self._route
        op = parked.op
        assert route is not None and op is not None
        key = op.parts[0].key
        answer = route.rendered.of(key.topic, key.partition, op)
        body = answer.body
        default_headers = self.server_state.default_headers
        if len(body) <= ANSWER_CHUNK:
            if parked.close:  # rare (Connection: close, HTTP/1.0): its own bytes
                return None, http11_response(fetch_body_response(body), default_headers, close=True)
            return None, answer.http11(default_headers, http11_ok)
        parked.gateway.check_answer_fits(body)
        return http11_head(fetch_body_response(body), default_headers, close=parked.close), body

    def _error_answer(self, response: Response, parked: Parked) -> bytes:
        return http11_response(response, self.server_state.default_headers, close=parked.close)

    def _unexpected(self, parked: Parked) -> Response:
        """As the app's catch-all (``CatchAll``): a bug answered as a JSON 500, counted, logged."""
        route = self._route
        assert route is not None
        route.count_unexpected_error()
        _log.exception("request_failed_unexpectedly", method="GET", path=parked.target, fast_path=True)
        return JSONResponse(UNEXPECTED_ERROR_BODY, status_code=500)

    def _respond(self, parked: Parked, data: bytes, head: bytes | None = None) -> None:
        """Write the answer: ``data`` whole, or ``head`` (if any) then ``data`` piece by piece."""
        route = self._route
        if route is not None:
            route.count_http11(data if head is None else head)
        if head is None and len(data) <= ANSWER_CHUNK:
            self.transport.write(data)
            self._answered(parked, data)
            return
        # Written piece by piece (ANSWER_CHUNK): the connection stays parked meanwhile, so bytes
        # the client pipelines wait (data_received) and no other response can interleave.
        parked.answer = memoryview(data)
        parked.head = head
        parked.gateway.answer_budget.take(data)  # given back once written, or the connection lost
        # Any byte left over in the transport's buffer pauses writing, and its draining to 0
        # resumes it: resume_writing is the signal to hand over the next piece.
        self.transport.set_write_buffer_limits(high=0, low=0)
        if head is not None:
            self.transport.write(head)  # a few hundred bytes: the body's pieces follow it
        self._send(parked)

    def _send(self, parked: Parked) -> None:
        """Hand ``parked``'s answer to the transport while its buffer is empty (see _respond)."""
        answer = parked.answer
        assert answer is not None, "only an answer being written is sent piece by piece"
        transport = self.transport
        sent = parked.sent
        end = len(answer)
        if sent < end:
            if transport.is_closing():
                return  # the client left: connection_lost lets go of the answer
            if transport.get_write_buffer_size():
                return  # resume_writing sends on once the buffer drained
            transport.write(answer[sent : sent + ANSWER_CHUNK])  # a slice of the shared bytes
            parked.sent = sent = sent + ANSWER_CHUNK
            if sent < end:
                # One piece per connection per loop iteration, even while the kernel takes every
                # piece (a socket's buffer takes MBs): 1,000 answers written in one go stalled
                # the loop, /healthz included, for over 2 s (min_bytes_flood, idle clients).
                if not transport.get_write_buffer_size():
                    self.loop.call_soon(self._send_if_parked, parked)
                return
        parked.sent = end
        parked.answer = None
        body = answer.obj
        answer.release()  # no view of the body outlives its last holder (AnswerBudget.on_release)
        parked.gateway.answer_budget.give_back(body)
        transport.set_write_buffer_limits()  # asyncio's defaults again, as uvicorn runs with
        self._answered(parked, parked.head or body[:12])  # type: ignore[index]  # bytes

    def _send_if_parked(self, parked: Parked) -> None:
        if self._parked is parked and parked.answer is not None:
            self._send(parked)

    def resume_writing(self) -> None:
        super().resume_writing()
        parked = self._parked
        if parked is not None and parked.answer is not None:
            self._send(parked)

    def _answered(self, parked: Parked, data: bytes | memoryview) -> None:
        """The answer (``data``: its first bytes at least) is with the transport: the connection's
        steps after a response."""
        self._parked = None
        if parked.target is not None:  # as uvicorn's access log line
            client = f"{self.client[0]}:{self.client[1]}" if self.client else ""
            status = int(data[9:12])  # b"HTTP/1.1 200 ..."
            line = '%s - "%s %s HTTP/%s" %d'
            self.access_logger.info(line, client, "GET", parked.target, parked.version, status)
        if self._closing or parked.close:
            self.server_state.total_requests += 1  # as uvicorn counts a response it closes after
            self.transport.close()  # after the answer: asyncio flushes what it buffered first
            return
        trailing = parked.pipelined
        if trailing:
            # A pipelined request: h11 starts afresh with what arrived meanwhile (the response
            # went out past it), then uvicorn's own steps after a response.
            self.conn = self._fresh_connection()
            self.conn.receive_data(trailing)
            self.on_response_complete()  # keep-alive and head timers, reading resumed
            self.handle_events()
            # A pipelined long poll parked again (conn is None, its head timer disarmed):
            # nothing more to do. Pinned by test_pipelined_poll_then_poll_are_answered_in_order.
            if (
                self._parked is None
                and not self._parked_conn_gone()
                and self.conn.their_state is not h11.IDLE
            ):
                self._disarm_head_timer()
            return
        # The common answer, one of a burst of thousands: uvicorn's on_response_complete without
        # its per-connection work. The keep-alive timeout and the next head's bound share one
        # loop timer with the burst's other connections (CoalescedTimers), and no h11 state is
        # made until the next request's bytes arrive (_ensure_conn): a fresh h11.Connection and
        # two TimerHandles were ~a third of the loop's Python time per answer (cProfile).
        self.server_state.total_requests += 1
        self._unset_keepalive_if_required()
        keep_alive = coalesced_timers(self.loop, self.timeout_keep_alive).call_later(self._keep_alive_expired)
        # uvicorn only ever cancel()s it, which a CoalescedTimeout does as a TimerHandle would.
        self.timeout_keep_alive_task = cast(asyncio.TimerHandle, keep_alive)
        self.flow.resume_reading()
        self._arm_head_timer()

    def _awaiting_head(self) -> bool:
        # After an ASGI response, uvicorn's on_response_complete reads the pipelined request at
        # once (handle_events): a long poll parks there and lets go of h11's state (conn None),
        # its head is in and its answer will re-arm the timer. Reading conn's state then was an
        # AttributeError that closed the connection before the poll was answered.
        # Pinned by test_pipelined_healthz_then_poll_are_answered_in_order.
        return self._parked is None and not self._parked_conn_gone() and super()._awaiting_head()

    def _ensure_conn(self) -> None:
        """Give the connection its h11 state if an answer left it without one (_respond)."""
        if self._parked is None and self._parked_conn_gone():
            self.conn = self._fresh_connection()

    def _keep_alive_expired(self) -> None:
        self._ensure_conn()  # uvicorn's handler tells h11 the connection closes
        self.timeout_keep_alive_handler()

    def _head_timed_out(self) -> None:
        self._ensure_conn()
        super()._head_timed_out()

    def _fresh_connection(self) -> PushbackConnection:
        size = self.config.h11_max_incomplete_event_size
        if size is None:
            return PushbackConnection(h11.SERVER)
        return PushbackConnection(h11.SERVER, max_incomplete_event_size=size)

    # -- connection life -----------------------------------------------------------------------

    def connection_lost(self, exc: Exception | None) -> None:
        parked, self._parked = self._parked, None
        if parked is not None and parked.answer is not None:
            parked.gateway.answer_budget.give_back(parked.answer.obj)
            parked.answer = None
        if parked is not None and self._route is not None:
            # The ASGI path's disconnect watcher does the same: the op leaves the timer and the
            # watch lists now, not at its max_wait_ms.
            parked.gateway.abandon_fetch(parked.waiter)  # no-op if it was answered meanwhile
        if self._parked_conn_gone():
            self.conn = self._fresh_connection()  # uvicorn tells h11 the connection closed
        super().connection_lost(exc)
        # Its socket's close (the kernel's FIN) goes to a thread, off the loop (_fanout_writes).
        fanout_writes(asyncio.get_running_loop()).close_later(self.transport)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # uvicorn's returns None: close
        # The client ended an idle connection after its answer: while a burst runs, its close
        # waits for the burst's end (._burst's docstring); True keeps the transport (not read).
        if (
            self._parked is None
            and self._parked_conn_gone()
            and not self._closing
            and answer_burst(self.loop).defer_close(self.transport)
        ):
            return True
        return None

    def _parked_conn_gone(self) -> bool:
        # A call, not ``self.conn is None`` inline: uvicorn types ``conn`` as never None.
        return getattr(self, "conn", None) is None

    def shutdown(self) -> None:
        if self._parked is not None:
            # As uvicorn for an open request: answered (the drain answers every waiter), then closed.
            self._closing = True
            return
        self._ensure_conn()
        super().shutdown()


def _tokens(value: bytes) -> list[bytes]:
    """A comma-separated header value's tokens, lowercased (``Connection: Keep-Alive, Close``)."""
    return [token.strip().lower() for token in value.split(b",")]


def long_poll_protocol(
    head_timeout_s: float, endpoint: LongPollEndpoint | None = None
) -> type[LongPollH11Protocol]:
    """The protocol class for uvicorn's ``http`` option: head time bound plus the long-poll path,
    serving the long polls of ``endpoint`` (the app's; None: every request goes through the app)."""
    attributes = {"head_timeout_s": float(head_timeout_s), "endpoint": endpoint}
    return type("LongPollH11Protocol", (LongPollH11Protocol,), attributes)
