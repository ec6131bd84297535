"""HTTP/2 with prior knowledge (h2c) beside HTTP/1.1 on the service's port, long polls served below ASGI.

Why: over HTTP/1.1 every waiting long poll holds a socket on the service *and* on the client, so
the open-file limit caps the waiters of one process (20,000 here, ~18,000 long polls). Real
clients multiplex: one HTTP/2 connection carries thousands of waiting streams.

How: the service's uvicorn protocol (:class:`..h1._long_poll.LongPollH11Protocol` or
:class:`..h1._head_timeout.HeadTimeoutH11Protocol`) gets the :class:`H2PriorKnowledge` mixin. When a
connection's first bytes are the HTTP/2 connection preface (``PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n``)
the connection is handed to an :class:`H2Session` (the ``h2`` library's state machine: framing,
HPACK, flow control, stream states); anything else is HTTP/1.1 exactly as before. TLS with ALPN
``h2`` is not offered (the service's TLS stays HTTP/1.1): h2c is for clients that know.

This module is the session: bytes in, requests taken or bridged, streams going away. How it
answers (batched answers, flow control, the write backlog) is :mod:`._writer`; its waiting and
arriving streams :mod:`._streams`; its bounds and the per-second abuse counters :mod:`._limits`;
the preface sniffing :mod:`._prior_knowledge`, the patched ``h2`` connection :mod:`._connection`,
the frame and header bounds before ``h2`` parses :mod:`._inbound`, the shared answer frames
:mod:`._answers`, and the streams the ASGI app serves :mod:`._bridge`.

A stream that is ``GET /topics/{t}/partitions/{p}/records`` without a body is checked with the
same code as the HTTP/1.1 fast path (header limits, authentication, the route's own match, the
topic policy, the query, :meth:`Gateway.fetch_then_call`: admission and its 429 + Retry-After,
the ``max_wait_ms`` clamp, the same operation) and parked as an :class:`H2Waiter` — a slotted
record that *is* the operation's callback: no task, no future, no closure per waiter. Its answer
is the route's 200 (the body bytes shared by every waiter answered the same), written as HEADERS
+ DATA on its stream, within the stream's and the connection's flow-control windows (what does
not fit waits for the client's WINDOW_UPDATE). The common answer does not go through ``h2``'s
per-stream calls: its two frames are built once and each stream writes them with its own id,
``h2``'s stream state and windows recorded as its own calls would leave them
(:mod:`._answers`: ~6 µs of the loop per answer where ``send_headers`` + ``send_data`` took
~28). Answers of one batch wake-up are written with one ``transport.write`` per connection. A
stream the client resets (RST_STREAM), or a connection that goes away, finishes its operation
CANCELLED at once.

Every other stream — another route, a request the fast path does not take or refuses (it answers
nothing itself: the app answers every refusal with its own JSON), a request with a body — is
bridged to the ASGI app (``http_version`` "2" in its scope) with its body read in full first
(at most :data:`MAX_BRIDGED_BODY_BYTES`, else 413) and its response sent when complete. The
answers are the same status, headers and bytes as over HTTP/1.1 (tests/service/test_h2.py).

Header blocks: HPACK is per connection and stateful, so equal headers normally encode to
different bytes on each stream. :class:`._answers.SharedHeaderEncoder` encodes without the
dynamic table (static table and literals only: always allowed, RFC 7541 §4.2), so equal header
lists encode to equal bytes, encoded once per process and reused on every stream of every
connection.

Limits: SETTINGS_MAX_CONCURRENT_STREAMS is ``admission.max_waiters`` + :data:`STREAM_HEADROOM` (one
connection may hold what the whole process admits, and past it still hears the 429 + Retry-After
rather than queueing in its client), SETTINGS_MAX_HEADER_LIST_SIZE
is ``service.max_header_bytes``. A graceful shutdown refuses new streams (RST_STREAM
REFUSED_STREAM), lets the drain answer the waiting ones, then sends GOAWAY and closes.
Requests that do not finish are bounded per connection as HTTP/1.1 bounds its one: a request
(HEADERS without END_STREAM, then its body) not ended within ``service.body_read_timeout_ms`` is
answered 408 and its stream reset (NO_ERROR: stop sending); at most
:data:`MAX_INCOMPLETE_REQUESTS` are held at once (more are refused with REFUSED_STREAM, safe to
retry); and past :data:`BUFFERED_BODY_BYTES` of buffered bodies the client's flow-control window
is no longer given back until requests leave. A client resetting more than
:data:`RAPID_RESETS_PER_SECOND` young streams a second (opened and reset at once: "rapid reset")
is sent GOAWAY ENHANCE_YOUR_CALM. A connection that opens no stream and holds none for
:data:`H2_IDLE_TIMEOUT_S` is closed (GOAWAY NO_ERROR). (tests/service/test_h2_request_bounds.py)
Not (yet) over HTTP/2: uvicorn's access log lines.

Concurrency contract: the event loop's thread only, as uvicorn's protocols; an operation may
finish on any thread, and its callback reaches the loop through the gateway's handoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import structlog

from ...answers._budget import HeldBodies
from ...answers._errors import REQUEST_HEADER_FIELDS_TOO_LARGE, RequestError
from ...answers._render import error_response
from ...settings import ServiceSettings
from .._endpoint import LongPollEndpoint
from ._answers import (
    SharedHeaderEncoder,
)
from ._bridge import H2Bridge, _Bridged
from ._connection import H2ServerConnection, HeaderListTooLarge
from ._inbound import InboundFrames
from ._limits import (
    BUFFERED_BODY_BYTES,
    H2_IDLE_TIMEOUT_S,
    MAX_BRIDGED_BODY_BYTES,
    MAX_INCOMPLETE_REQUESTS,
    READ_PAUSE_BACKLOG,
    STREAM_HEADROOM,
    AbuseCounters,
)
from ._streams import H2Request, H2Waiter

__all__ = ["H2_PREFACE", "H2Session"]

_log = structlog.get_logger("purgatory.service")

H2_PREFACE = (
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # RFC 9113 §3.4: what a client with prior knowledge sends first
)


class H2Session(H2Bridge):
    """One HTTP/2 connection: ``h2``'s state machine, its waiting streams and its bridged ones.

    ``waiters`` (stream id -> :class:`H2Waiter`) are the parked long polls; ``requests`` the
    streams whose request is still arriving; ``bridged`` the ones the ASGI app serves; ``blocked``
    the answers' bytes waiting for flow-control window. A stream is in at most one of them.
    """

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol  # the uvicorn protocol the transport calls (app, state, transport)
        self.transport: asyncio.Transport = protocol.transport
        self.loop: asyncio.AbstractEventLoop = protocol.loop
        # The app's endpoint, handed to the protocol class by the server (None: not our app's);
        # its long-poll route only while the fast path is on.
        endpoint: LongPollEndpoint | None = getattr(protocol, "endpoint", None)
        self.route = endpoint if endpoint is not None and endpoint.serves_long_polls else None
        # The app's shared answers, looked up once: Starlette's ``app.state`` answers each
        # attribute through a Python-level __getattr__ (once per answer of a burst, before).
        self.rendered = None if self.route is None else self.route.rendered
        # The app's settings, the very object its gateway admits by (None: not our app).
        settings = None if endpoint is None else endpoint.settings
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            # Our answers' headers are lowercase bytes already (Starlette's raw headers, uvicorn's
            # defaults): normalising and validating each stream's cost more than its encoding.
            normalize_outbound_headers=False,
            validate_outbound_headers=False,
        )
        self.conn = H2ServerConnection(config)
        self.conn.encoder = SharedHeaderEncoder()
        initial: dict[h2.settings.SettingCodes, int] = {}
        if settings is not None:
            initial[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = (
                settings.admission.max_waiters + STREAM_HEADROOM
            )
            initial[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] = settings.service.max_header_bytes
            # What is advertised is what is decoded (h2 would decode 64 KiB whatever it says).
            self.conn.decoder.max_header_list_size = settings.service.max_header_bytes
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values=initial)
        # The frame headers walked before h2 buffers a byte (oversized frames, floods).
        self.inbound = InboundFrames(len(H2_PREFACE))
        self.abuse = AbuseCounters()  # flood frames and rapid resets, per second
        self.read_paused = False  # reading paused past READ_PAUSE_BACKLOG, until the transport drains
        self.waiters: dict[int, H2Waiter] = {}
        self.requests: dict[int, H2Request] = {}
        self.bridged: dict[int, _Bridged] = {}
        # Counted in the gateway's answer budget while held (._answer_budget).
        self.blocked = HeldBodies(None if endpoint is None else endpoint.answer_budget())
        # True when a body waits in ``blocked`` for the transport to drain, not for a window.
        self.backlogged = False
        self.closing = False  # graceful shutdown: new streams refused, GOAWAY once the last is answered
        # Requests still arriving (``requests``): their time bound (as HTTP/1.1's body timeout),
        # the body bytes they buffer, and the flow-control acknowledgements held back past
        # BUFFERED_BODY_BYTES (given back, oldest first, as buffered requests leave).
        self.body_timeout_ms: int = (
            settings.service.body_read_timeout_ms
            if settings is not None
            else ServiceSettings.model_fields["body_read_timeout_ms"].default
        )
        self.buffered = 0
        self.held_acks: deque[tuple[int, int]] = deque()
        self._request_timer: asyncio.TimerHandle | None = None
        # Idle connections: streams opened so far, and as of the last idle check.
        self._opened = 0
        self._opened_at_check = 0
        self._idle_timer: asyncio.TimerHandle | None = self.loop.call_later(
            H2_IDLE_TIMEOUT_S, self._idle_check
        )
        # Bytes to write with the next flush: h2's, then the shared answers' frames, in order.
        self.out = bytearray()
        self._flush_scheduled = False
        # Waiters whose operation finished, to be answered together in one loop callback.
        self.finished: list[H2Waiter] = []
        self._answer_scheduled = False
        self.conn.initiate_connection()
        self.flush()

    # -- bytes in ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        # Checked as the frame headers arrive, before h2 buffers a frame whole (_h2_inbound).
        floods, oversized = self.inbound.scan(data, conn.max_inbound_frame_size)
        if oversized >= 0:
            _log.info("h2_frame_too_large", length=oversized, max=conn.max_inbound_frame_size)
            self._go_away(h2.errors.ErrorCodes.FRAME_SIZE_ERROR)  # RFC 9113 §4.2: a connection error
            return
        if floods and self._flooded(floods):
            return
        refused = conn.refused
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # h2 queued its GOAWAY naming the error
            _log.info("h2_protocol_error", error=str(exc)[:200])
            self.flush()
            self.transport.close()
            return
        if conn.refused != refused and self._flooded(conn.refused - refused):
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self._request_received(event)
            elif isinstance(event, h2.events.DataReceived):
                self._data_received(event)
            elif isinstance(event, h2.events.StreamEnded):
                request = self.requests.pop(event.stream_id, None)
                if request is not None:
                    body = self._forget_body(request)
                    if not request.refused:
                        self._dispatch(event.stream_id, request.headers, body)
            elif isinstance(event, h2.events.StreamReset):
                if self._released(event.stream_id) and self._too_many_resets(event.stream_id):
                    return
            elif isinstance(event, h2.events.WindowUpdated):
                self._unblock(event.stream_id)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                    self._unblock(0)
            elif isinstance(event, HeaderListTooLarge):
                self._header_list_too_large(event)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closing = True
        if self.requests and self._request_timer is None:
            self._arm_request_timer()
        self.flush()
        self._pause_reading_if_backlogged()
        self._close_if_done()

    def _flooded(self, frames: int) -> bool:
        """Count flood frames; past CONTROL_FRAMES_PER_SECOND, GOAWAY ENHANCE_YOUR_CALM and close (True)."""
        count = self.abuse.flood(frames, self.loop.time())
        if not count:
            return False
        _log.warning("h2_control_flood", frames=count, client=str(self.protocol.client)[:100])
        self._go_away(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        return True

    def _too_many_resets(self, stream_id: int) -> bool:
        """Count a reset of a young served stream; past RAPID_RESETS_PER_SECOND, GOAWAY and close (True)."""
        count = self.abuse.young_reset(stream_id, self.loop.time())
        if not count:
            return False
        _log.warning("h2_rapid_reset", resets=count, client=str(self.protocol.client)[:100])
        self._go_away(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        return True

    def _go_away(self, code: h2.errors.ErrorCodes) -> None:
        """GOAWAY naming ``code``, then close: connection_lost releases every stream still held."""
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.close_connection(code)
        self.flush()
        self.transport.close()

    def _pause_reading_if_backlogged(self) -> None:
        """Stop reading while the transport holds more than READ_PAUSE_BACKLOG unsent (its comment).

        Only while the transport has paused our writing: then its resume_writing is due once it
        drains (writing_resumed reads on), or connection_lost if it never does.
        """
        if (
            not self.read_paused
            and self.transport.get_write_buffer_size() > READ_PAUSE_BACKLOG
            and self.protocol.flow.write_paused
            and not self.transport.is_closing()
        ):
            self.read_paused = True
            self.protocol.flow.pause_reading()

    def _header_list_too_large(self, event: HeaderListTooLarge) -> None:
        """431 on the stream alone (as HTTP/1.1's HeaderLimits answers), its request dropped."""
        stream_id = event.stream_id
        self._opened += 1
        request = self.requests.pop(stream_id, None)  # trailers of a request still arriving
        if request is not None:
            self._forget_body(request)
        limit = self.conn.decoder.max_header_list_size
        error = RequestError(
            REQUEST_HEADER_FIELDS_TOO_LARGE,
            "REQUEST_HEADER_FIELDS_TOO_LARGE",
            "headers",
            f"header list over the {limit} bytes advertised (SETTINGS_MAX_HEADER_LIST_SIZE)",
        )
        self._respond_with(stream_id, error_response(error))
        if not event.stream_ended:
            self._reset(stream_id, h2.errors.ErrorCodes.NO_ERROR)  # stop sending (RFC 9113 §8.1)

    def _request_received(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        self._opened += 1
        now = self.loop.time()
        self.abuse.opened(stream_id, now)
        if self.closing or len(self.requests) >= MAX_INCOMPLETE_REQUESTS:
            # Shutting down (retry elsewhere), or too many unfinished requests (retry later).
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        self.requests[stream_id] = H2Request(list(event.headers or ()), now)

    def _data_received(self, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id
        length = event.flow_controlled_length
        request = self.requests.get(stream_id)
        if request is None or request.refused:
            self.conn.acknowledge_received_data(length, stream_id)  # dropped: the window goes back
            return
        data = event.data or b""
        request.body += data
        self.buffered += len(data)
        if len(request.body) > MAX_BRIDGED_BODY_BYTES:
            self.conn.acknowledge_received_data(length, stream_id)
            request.refused = True
            self._forget_body(request)
            error = RequestError(
                413, "PAYLOAD_TOO_LARGE", "body", f"request body over {MAX_BRIDGED_BODY_BYTES} bytes"
            )
            self._respond_with(stream_id, error_response(error))
        elif self.buffered <= BUFFERED_BODY_BYTES and not self.held_acks:
            self.conn.acknowledge_received_data(length, stream_id)
        else:
            # Buffered enough: the window stays spent until requests leave (_forget_body).
            self.held_acks.append((stream_id, length))

    def _forget_body(self, request: H2Request) -> bytearray:
        """Take ``request``'s body out of the buffered count and give back the windows held for it."""
        body, request.body = request.body, bytearray()
        self.buffered -= len(body)
        held = self.held_acks
        while held and self.buffered <= BUFFERED_BODY_BYTES:
            stream_id, length = held.popleft()
            self.conn.acknowledge_received_data(length, stream_id)  # a closed stream: the connection's only
        return body

    def _arm_request_timer(self) -> None:
        # Requests are held in arrival order with one timeout: the first one held is due first.
        due = next(iter(self.requests.values())).started + self.body_timeout_ms / 1000
        self._request_timer = self.loop.call_at(due, self._expire_requests)

    def _expire_requests(self) -> None:
        """408 each request not ended within ``body_read_timeout_ms`` (as HTTP/1.1 answers a body
        not received in time); its stream is then reset (NO_ERROR: stop sending, RFC 9113 §8.1)."""
        self._request_timer = None
        now = self.loop.time()
        started_by = now - self.body_timeout_ms / 1000
        for stream_id, request in list(self.requests.items()):
            if request.started > started_by:
                break  # held in arrival order: the rest are later still
            del self.requests[stream_id]
            received = len(self._forget_body(request))
            if not request.refused:
                error = RequestError(
                    408,
                    "REQUEST_TIMEOUT",
                    "body",
                    f"{received} body byte(s) received in {now - request.started:.1f} s; "
                    f"the whole request must arrive within {self.body_timeout_ms} ms",
                )
                self._respond_with(stream_id, error_response(error))
            self._reset(stream_id, h2.errors.ErrorCodes.NO_ERROR)
        if self.requests:
            self._arm_request_timer()
        self.flush()

    # -- a complete request --------------------------------------------------------------------

    def _dispatch(self, stream_id: int, fields: list[tuple[bytes, bytes]], body: bytearray) -> None:
        pseudo: dict[bytes, bytes] = {}
        headers: list[tuple[bytes, bytes]] = []
        for name, value in fields:
            if name[:1] == b":":
                pseudo[name] = value
            else:
                headers.append((name, value))
        if b"host" not in (name for name, _ in headers) and b":authority" in pseudo:
            headers.insert(0, (b"host", pseudo[b":authority"]))  # as HTTP/1.1 clients send it
        if self.route is not None and not body and pseudo.get(b":method") == b"GET":
            try:
                if self._take(stream_id, pseudo, headers):
                    return
            except Exception:  # a bug: the ASGI path answers the request instead
                _log.exception("h2_long_poll_take_failed", path=pseudo.get(b":path", b"")[:200])
        self._bridge(stream_id, pseudo, headers, bytes(body))

    def _scope(self, pseudo: dict[bytes, bytes], headers: list[tuple[bytes, bytes]]) -> dict[str, Any] | None:
        protocol = self.protocol
        raw_path, _, query_string = pseudo.get(b":path", b"/").partition(b"?")
        try:
            path = unquote(raw_path.decode("ascii"))
        except UnicodeDecodeError:
            return None
        return {
            "type": "http",
            "asgi": {"version": protocol.config.asgi_version, "spec_version": "2.3"},
            "http_version": "2",
            "server": protocol.server,
            "client": protocol.client,
            "scheme": protocol.scheme,
            "method": pseudo.get(b":method", b"GET").decode("ascii", "replace"),
            "root_path": protocol.root_path,
            "path": protocol.root_path + path,
            "raw_path": protocol.root_path.encode("ascii") + raw_path,
            "query_string": query_string,
            "headers": headers,
            "state": protocol.app_state.copy(),
        }

    def _take(self, stream_id: int, pseudo: dict[bytes, bytes], headers: list[tuple[bytes, bytes]]) -> bool:
        """Park the stream if it is a long poll the fast path serves (as ``LongPollH11Protocol._take``)."""
        route = self.route
        assert route is not None
        if not route.plain_get_headers(headers):
            return False
        scope = self._scope(pseudo, headers)
        if scope is None:
            return False
        poll = route.checked_poll(scope)
        if poll is None:
            return False
        gateway, topic, partition, params = poll
        waiter = H2Waiter(self, stream_id, gateway, topic, partition, params.offset)
        try:
            handle = gateway.fetch_then_call(topic, partition, params, waiter)
        except RequestError:
            return False  # admission's 429 or a 503: the ASGI path answers it, with the same checks
        if handle is None:
            return False  # nothing was submitted: fetch() awaits what is not cached
        waiter.handle = handle
        self.waiters[stream_id] = waiter
        return True

    # -- streams and the connection going away --------------------------------------------------

    def _released(self, stream_id: int) -> bool:
        """The client reset the stream: its operation is finished CANCELLED now, not at max_wait_ms.

        True if the stream was still being served (what a rapid reset is counted by).
        """
        waiter = self.waiters.pop(stream_id, None)
        if waiter is not None and waiter.handle is not None:
            waiter.gateway.abandon_fetch(waiter.handle)  # no-op if it was answered meanwhile
        request = self.requests.pop(stream_id, None)
        if request is not None:
            self._forget_body(request)
        exchange = self.bridged.pop(stream_id, None)
        if exchange is not None:
            exchange.left.set()  # the app's disconnect watcher cancels its wait
        blocked = self.blocked.pop(stream_id, None)
        return waiter is not None or request is not None or exchange is not None or blocked is not None

    def _idle_check(self) -> None:
        """Close the connection if it opened no stream since the last check and holds none."""
        self._idle_timer = None
        held = self.waiters or self.requests or self.bridged or self.blocked
        if not held and self._opened == self._opened_at_check and not self.transport.is_closing():
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.close_connection()  # GOAWAY NO_ERROR: the client opens a new one when needed
            self.flush()
            self.transport.close()
            return
        self._opened_at_check = self._opened
        self._idle_timer = self.loop.call_later(H2_IDLE_TIMEOUT_S, self._idle_check)

    def connection_lost(self) -> None:
        for timer in (self._request_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._request_timer = self._idle_timer = None
        for stream_id in [*self.waiters, *self.requests, *self.bridged, *self.blocked]:
            self._released(stream_id)
        self._free_buffers()

    def _free_buffers(self) -> None:
        """Let go of what the closed connection buffered, now rather than at a full collection.

        ``h2``'s connection is a reference cycle of its own (its frame dispatch table holds its
        bound methods), and the service raises the GC thresholds, so full collections are rare:
        buffers it held stayed for minutes (a partial frame, a header block waiting for its
        CONTINUATION, bytes never sent; the attack report's 150 MB a round of 10 connections).
        Emptied here, and the cycle broken, the connection is freed by reference counting.
        (test_h2_hostile_clients: test_a_closed_connection_is_freed_without_a_collection)
        """
        conn = self.conn
        buffer = conn.incoming_buffer
        buffer._data = bytearray()
        buffer._headers_buffer = []
        conn._data_to_send = bytearray()
        conn.streams = {}
        conn._frame_dispatch_table = {}  # the cycle: h2 reads nothing more once the transport is gone
        self.out = bytearray()
        self.blocked.clear()  # empty already (connection_lost released every stream): no budget held
        self.held_acks.clear()
        self.finished = []

    def shutdown(self) -> None:
        """Graceful shutdown: no new streams; GOAWAY and close once the open ones are answered."""
        self.closing = True
        self._close_if_done()

    def _close_if_done(self) -> None:
        if not self.closing or self.waiters or self.bridged or self.blocked or self.transport.is_closing():
            return
        # The state machine may be closed already (the client's GOAWAY): nothing more to say then.
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.close_connection()
        self.flush()
        self.transport.close()
