"""What one HTTP/2 connection may hold of requests that do not finish (:class:`H2Session`).

HTTP/1.1 holds one unfinished request per connection, for at most ``service.body_read_timeout_ms``.
Over HTTP/2 one connection multiplexes up to ~60,000 streams: without bounds a client could open
them all with HEADERS and never end them, and push a body into each (the window went back at
once), holding unbounded memory. Here, without sockets or Kafka: the ``h2`` library's client and
the service's session, bytes carried between them in memory.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
from purgatory.adapters.service.http.h2 import _long_poll as _h2_long_poll
from purgatory.adapters.service.http.h2._limits import (
    BUFFERED_BODY_BYTES,
    MAX_BRIDGED_BODY_BYTES,
    MAX_INCOMPLETE_REQUESTS,
    RAPID_RESET_AGE_S,
    RAPID_RESETS_PER_SECOND,
)
from purgatory.adapters.service.http.h2._long_poll import H2Session

from .conftest import RecordingTransport, until

INITIAL_WINDOW = 65_535  # RFC 9113 §6.9.2: the connection's receive window until it is opened
POST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":authority", b"127.0.0.1"),
    (b":path", b"/topics/t/records"),
    (b"content-type", b"application/json"),
]


class _Clock:
    """An event loop whose time the test moves; its timers and calls are taken, never run."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any) -> Any:
        return SimpleNamespace(cancel=lambda: None)

    def call_later(self, delay: float, callback: Any, *args: Any) -> Any:
        return SimpleNamespace(cancel=lambda: None)

    def call_soon(self, callback: Any, *args: Any) -> Any:
        return SimpleNamespace(cancel=lambda: None)


class _Link:
    """A client connection of the ``h2`` library and a service session, bytes carried in memory."""

    def __init__(self, loop: asyncio.AbstractEventLoop | _Clock) -> None:
        self.transport = RecordingTransport()
        protocol = SimpleNamespace(
            transport=self.transport,
            loop=loop,
            app=object(),  # no app behind: these requests never finish, nothing is dispatched
            server_state=SimpleNamespace(default_headers=[(b"server", b"test")]),
            tasks=set(),
            client=("127.0.0.1", 50000),
        )
        self.session = H2Session(protocol)
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.client.initiate_connection()
        self.events: list[h2.events.Event] = []
        self.carry()

    def carry(self) -> None:
        """The client's bytes to the session, then the session's answers back to the client."""
        self.session.data_received(self.client.data_to_send())
        self.read()

    def read(self) -> None:
        self.events += self.client.receive_data(self.transport.take())

    def open(self) -> int:
        stream_id = self.client.get_next_available_stream_id()
        self.client.send_headers(stream_id, POST, end_stream=False)
        return stream_id

    def resets(self) -> dict[int, h2.errors.ErrorCodes | int]:
        return {
            e.stream_id: e.error_code
            for e in self.events
            if isinstance(e, h2.events.StreamReset) and e.error_code is not None
        }


async def test_unfinished_requests_past_the_limit_are_refused_as_retriable() -> None:
    link = _Link(asyncio.get_running_loop())
    held = [link.open() for _ in range(MAX_INCOMPLETE_REQUESTS)]
    link.carry()
    assert sorted(link.session.requests) == held
    refused = link.open()
    link.carry()
    assert link.resets() == {refused: h2.errors.ErrorCodes.REFUSED_STREAM}, "retry later, not an error"
    assert len(link.session.requests) == MAX_INCOMPLETE_REQUESTS
    link.client.reset_stream(held[0], h2.errors.ErrorCodes.CANCEL)  # one leaves: room for one more
    accepted = link.open()
    link.carry()
    assert accepted in link.session.requests and accepted not in link.resets()
    link.session.connection_lost()


async def test_buffered_bodies_are_bounded_by_withholding_the_clients_window() -> None:
    link = _Link(asyncio.get_running_loop())
    client, session = link.client, link.session
    # Streams enough to reach the bound, each body under the per-request limit (so no 413).
    per_stream = MAX_BRIDGED_BODY_BYTES - 1024
    streams = [link.open() for _ in range(BUFFERED_BODY_BYTES // per_stream + 2)]
    link.carry()
    sent = dict.fromkeys(streams, 0)
    chunk = b"x" * client.max_outbound_frame_size
    progress = True
    while progress:  # send what the windows allow, carry it, read the window updates; until stuck
        progress = False
        for stream_id in streams:
            size = min(client.local_flow_control_window(stream_id), len(chunk), per_stream - sent[stream_id])
            if size > 0:
                client.send_data(stream_id, chunk[:size])
                sent[stream_id] += size
                progress = True
        link.carry()
        assert session.buffered <= BUFFERED_BODY_BYTES + INITIAL_WINDOW, "buffered past the bound"
    assert session.buffered == sum(sent.values()), "every byte the client could send is held"
    assert session.buffered > BUFFERED_BODY_BYTES and session.held_acks, "the bound was reached"
    assert client.outbound_flow_control_window == 0, "the client has no window left"
    assert sum(sent.values()) < len(streams) * per_stream, "the client could not send everything"
    # A request leaving (the client resets it) frees its body: the held windows go back.
    client.reset_stream(streams[0], h2.errors.ErrorCodes.CANCEL)
    link.carry()
    assert session.buffered == sum(sent.values()) - sent[streams[0]]
    assert client.outbound_flow_control_window > 0, "the window was given back"
    session.connection_lost()
    assert session.buffered == 0 and not session.held_acks


async def test_a_request_not_finished_in_time_is_answered_408_and_its_stream_reset() -> None:
    link = _Link(asyncio.get_running_loop())
    link.session.body_timeout_ms = 50  # the service's body_read_timeout_ms, shortened
    stream_id = link.open()
    link.client.send_data(stream_id, b'{"records": [')  # ... and never the rest
    link.carry()
    assert link.session._request_timer is not None, "a time bound is armed"
    await until(lambda: bool(link.transport.written), "the session's answer to the unfinished request")
    link.read()
    (response,) = [e for e in link.events if isinstance(e, h2.events.ResponseReceived)]
    assert response.stream_id == stream_id and dict(response.headers or ())[b":status"] == b"408"  # type: ignore[arg-type]
    body = b"".join(e.data or b"" for e in link.events if isinstance(e, h2.events.DataReceived))
    error = json.loads(body)
    assert error["error"] == "REQUEST_TIMEOUT" and error["field"] == "body", error
    assert "13 body byte(s)" in error["message"], error["message"]
    assert link.resets() == {stream_id: h2.errors.ErrorCodes.NO_ERROR}, "told to stop sending (RFC 9113 §8.1)"
    assert link.session.requests == {} and link.session.buffered == 0
    assert link.session._request_timer is None, "nothing left to time"


async def test_a_client_resetting_served_streams_past_the_rate_is_sent_away_with_enhance_your_calm() -> None:
    # "Rapid reset" (CVE-2023-44487): each stream opened and reset at once cost the service a
    # request's work and the client nothing. Rounds of 50 (under the unfinished-request bound).
    link = _Link(asyncio.get_running_loop())
    resets = 0

    def reset_round() -> None:
        nonlocal resets
        streams = [link.open() for _ in range(50)]
        for stream_id in streams:
            link.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        resets += len(streams)
        link.carry()

    while resets + 50 <= RAPID_RESETS_PER_SECOND:
        reset_round()
    assert not link.transport.closed, f"{resets} resets are within the rate"
    assert link.session.requests == {}, "every reset stream released"
    reset_round()
    terminated = [e for e in link.events if isinstance(e, h2.events.ConnectionTerminated)]
    assert [e.error_code for e in terminated] == [h2.errors.ErrorCodes.ENHANCE_YOUR_CALM]
    assert link.transport.closed, "the connection is closed after its GOAWAY"


async def test_resets_of_streams_that_have_waited_are_a_client_giving_up_not_a_rapid_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A proxy cancels the long polls its own clients gave up on: many resets, of old streams.
    monkeypatch.setattr(_h2_long_poll, "MAX_INCOMPLETE_REQUESTS", 2 * RAPID_RESETS_PER_SECOND)
    clock = _Clock()
    link = _Link(clock)
    streams = [link.open() for _ in range(RAPID_RESETS_PER_SECOND + 100)]
    link.carry()
    assert len(link.session.requests) == len(streams)
    clock.now += RAPID_RESET_AGE_S + 0.5  # they have been served a while
    for stream_id in streams:
        link.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
    link.carry()
    assert not link.transport.closed, "old streams reset: not a rapid reset"
    assert link.session.requests == {}
    # The same count of streams opened and reset at once on it is one.
    for _ in range(2):
        fresh = [link.open() for _ in range(RAPID_RESETS_PER_SECOND // 2 + 1)]
        for stream_id in fresh:
            link.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        link.carry()
    assert link.transport.closed


async def test_a_connection_that_opens_and_holds_no_stream_is_closed_after_the_idle_timeout() -> None:
    # HTTP/1.1's idle connections close after the keep-alive timeout; an HTTP/2 one held its
    # socket forever. The check runs every H2_IDLE_TIMEOUT_S (called here instead of waiting).
    quiet = _Link(_Clock())
    quiet.session._idle_check()
    assert quiet.transport.closed, "opened no stream: closed"
    goaway = [
        e
        for e in quiet.events + quiet.client.receive_data(bytes(quiet.transport.written))
        if isinstance(e, h2.events.ConnectionTerminated)
    ]
    assert [e.error_code for e in goaway] == [h2.errors.ErrorCodes.NO_ERROR], "told why: a clean GOAWAY"

    busy = _Link(_Clock())
    stream_id = busy.open()
    busy.carry()
    busy.session._idle_check()  # a stream opened since the last check
    busy.session._idle_check()  # none opened since, but one is held (its request still arriving)
    assert not busy.transport.closed, "a connection holding a stream is not idle"
    busy.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
    busy.carry()
    busy.session._idle_check()
    assert busy.transport.closed, "nothing opened, nothing held: idle"
