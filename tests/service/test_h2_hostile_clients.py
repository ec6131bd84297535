"""An HTTP/2 connection against a hostile client: control-frame floods, oversized frames, streams
past the limit, header lists past the advertised size, and what a closed connection leaves behind
(the attack report "Hardening, round two", items 2, 7 and 12; :class:`H2Session`).

Two kinds of test: the session fed in memory by the ``h2`` library's client (no sockets, no
Kafka), and raw sockets against the real server (127.0.0.1; the session's Kafka where a route
needs it) where what is pinned is the server's reading, writing and freeing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import struct
import weakref
from collections.abc import Iterator
from typing import Any

import h2.errors
import h2.events
import h2.settings
import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service.http.h2 import _limits as _h2_limits
from purgatory.adapters.service.http.h2 import _long_poll as _h2_long_poll
from purgatory.adapters.service.http.h2._limits import CONTROL_FRAMES_PER_SECOND, READ_PAUSE_BACKLOG
from purgatory.adapters.service.http.h2._long_poll import H2_PREFACE, H2Session
from purgatory.adapters.service.settings import AdmissionSettings

from purgatory.settings import Settings
from tests.kafka.kafka_fixtures import TopicFactory

from .conftest import WAIT_S, Served, serving, until
from .test_h2_request_bounds import POST, _Link

ANNOUNCED = (1 << 24) - 1  # the most a frame header can announce (24 bits): "16 MiB"
MAX_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE advertised (h2's default, RFC 9113 §6.5.2)
DATA, HEADERS, PRIORITY, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x2, 0x4, 0x6, 0x7
GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"127.0.0.1"), (b":path", b"/healthz")]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"", length: int | None = None) -> bytes:
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload


def _terminated(link: _Link) -> h2.events.ConnectionTerminated | None:
    return next((e for e in link.events if isinstance(e, h2.events.ConnectionTerminated)), None)


# -- item 2: control frames ---------------------------------------------------------------------

FLOODS = {
    "ping": lambda i: frame(PING, 0, 0, struct.pack(">Q", i)),
    "settings": lambda i: frame(SETTINGS, 0, 0),
    "priority": lambda i: frame(PRIORITY, 0, 1 + 2 * (i % 1000), b"\0\0\0\0\x0f"),
    "empty data": lambda i: frame(DATA, 0, 1),
}


@pytest.mark.parametrize("kind", list(FLOODS))
async def test_a_flood_of_control_or_empty_frames_is_answered_with_goaway_enhance_your_calm(
    kind: str,
) -> None:
    link = _Link(asyncio.get_running_loop())
    link.client.send_headers(1, POST, end_stream=False)  # a request arriving: empty DATA is on it
    link.carry()
    flood = b"".join(FLOODS[kind](i) for i in range(CONTROL_FRAMES_PER_SECOND + 1))
    link.session.data_received(flood)
    link.read()
    terminated = _terminated(link)
    assert terminated is not None, f"{CONTROL_FRAMES_PER_SECOND + 1} {kind} frames in a second: GOAWAY"
    assert terminated.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert link.transport.closed
    acks = [e for e in link.events if isinstance(e, h2.events.PingAckReceived)]
    assert acks == [], "the flood was refused before h2 acknowledged any of it"


async def test_control_frames_below_the_rate_are_acknowledged_and_the_connection_stays() -> None:
    link = _Link(asyncio.get_running_loop())
    for i in range(CONTROL_FRAMES_PER_SECOND // 2):
        link.client.ping(struct.pack(">Q", i))
    link.carry()
    acks = [e for e in link.events if isinstance(e, h2.events.PingAckReceived)]
    assert len(acks) == CONTROL_FRAMES_PER_SECOND // 2 and not link.transport.closed
    assert _terminated(link) is None


# -- item 7: partial frames larger than advertised ----------------------------------------------


async def test_a_frame_announcing_more_than_the_max_frame_size_is_refused_from_its_header() -> None:
    link = _Link(asyncio.get_running_loop())
    link.session.data_received(frame(DATA, 0, 1, b"x" * 1024, length=ANNOUNCED))
    link.read()
    terminated = _terminated(link)
    assert terminated is not None and terminated.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR
    assert link.transport.closed
    link.session.connection_lost()
    assert len(link.session.conn.incoming_buffer._data) == 0, "nothing of the frame was buffered"


async def test_a_frame_of_exactly_the_max_frame_size_is_accepted() -> None:
    link = _Link(asyncio.get_running_loop())
    stream_id = link.open()
    link.client.send_data(stream_id, b"x" * MAX_FRAME)
    link.carry()
    assert len(link.session.requests[stream_id].body) == MAX_FRAME and not link.transport.closed


# -- item 12: compliance ------------------------------------------------------------------------


async def test_a_stream_past_the_limit_is_refused_alone_and_the_others_stay() -> None:
    link = _Link(asyncio.get_running_loop())
    limit = 3
    link.session.conn.local_settings = h2.settings.Settings(
        client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limit}
    )
    held = [link.open() for _ in range(limit)]
    link.carry()
    # A header field the client's encoder indexes: the refused block must still be decoded.
    extra = (b"x-trace", b"refused-but-decoded")
    refused = link.client.get_next_available_stream_id()
    link.client.send_headers(refused, [*POST, extra], end_stream=False)
    link.carry()
    assert link.resets() == {refused: h2.errors.ErrorCodes.REFUSED_STREAM}, "RFC 9113 §5.1.2"
    assert _terminated(link) is None and not link.transport.closed, "a stream error, not the connection's"
    assert sorted(link.session.requests) == held
    link.client.reset_stream(held[0], h2.errors.ErrorCodes.CANCEL)
    accepted = link.client.get_next_available_stream_id()
    link.client.send_headers(accepted, [*POST, extra], end_stream=False)
    link.carry()
    assert link.session.requests[accepted].headers[-1] == extra, "HPACK still in step with the client"
    link.session.connection_lost()


async def test_a_header_list_over_the_advertised_size_is_answered_431_on_its_stream_alone() -> None:
    link = _Link(asyncio.get_running_loop())
    limit = 16 * 1024
    link.session.conn.decoder.max_header_list_size = limit  # as the service advertises it
    big = (b"x-big", b"b" * limit)
    ended, unended = link.client.get_next_available_stream_id(), 0
    link.client.send_headers(ended, [*GET, big], end_stream=True)
    unended = link.client.get_next_available_stream_id()
    link.client.send_headers(unended, [*POST, big], end_stream=False)
    link.carry()
    responses = {
        e.stream_id: dict(e.headers) for e in link.events if isinstance(e, h2.events.ResponseReceived)
    }
    assert responses[ended][b":status"] == b"431" and responses[unended][b":status"] == b"431"
    assert link.resets() == {unended: h2.errors.ErrorCodes.NO_ERROR}, "stop sending its body"
    assert _terminated(link) is None and not link.transport.closed
    # The oversized blocks were decoded whole: a request reusing their indexed field decodes right.
    fits = (b"x-big", b"b" * 100)
    stream_id = link.client.get_next_available_stream_id()
    link.client.send_headers(stream_id, [*POST, fits], end_stream=False)
    link.carry()
    assert link.session.requests[stream_id].headers[-1] == fits
    link.session.connection_lost()


async def test_a_header_list_at_the_advertised_size_is_taken() -> None:
    link = _Link(asyncio.get_running_loop())
    limit = 16 * 1024
    link.session.conn.decoder.max_header_list_size = limit
    size = sum(len(n) + len(v) + 32 for n, v in POST)  # RFC 9113 §6.5.2
    name = b"x-fill"
    fill = (name, b"f" * (limit - size - len(name) - 32))
    stream_id = link.client.get_next_available_stream_id()
    link.client.send_headers(stream_id, [*POST, fill], end_stream=False)
    link.carry()
    assert stream_id in link.session.requests, "exactly at the limit: a request like any other"
    assert _terminated(link) is None and not link.resets()
    link.session.connection_lost()


# -- against the real server --------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(kafka_settings: KafkaSettings) -> Iterator[Served]:
    with serving(Settings(kafka=kafka_settings, admission=AdmissionSettings(max_waiters=4))) as served:
        yield served


def _sessions(served: Served) -> list[H2Session]:
    connections = list(served.server.server.server_state.connections)
    return [c._h2 for c in connections if getattr(c, "_h2", None) is not None]


class _RawClient:
    """A socket speaking raw frames: the preface and an empty SETTINGS, then whatever the test sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, served: Served, rcvbuf: int | None = None) -> _RawClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=16 * 1024)
        writer.write(H2_PREFACE + frame(SETTINGS, 0, 0))
        return cls(reader, writer)

    async def next_frame(self) -> tuple[int, int, bytes]:
        head = await self.reader.readexactly(9)
        length = int.from_bytes(head[:3], "big")
        return head[3], head[4], await self.reader.readexactly(length)

    async def goaway_code(self) -> int:
        """Frames until the GOAWAY: its error code; then the server must close."""
        while True:
            kind, _, payload = await asyncio.wait_for(self.next_frame(), WAIT_S)
            if kind == GOAWAY:
                # Closed with the client's bytes unread, the server's kernel resets the connection
                # (RST) rather than ending it: either is the close.
                with contextlib.suppress(ConnectionResetError):
                    rest = await asyncio.wait_for(self.reader.read(), WAIT_S)
                    assert rest == b"", "closed after GOAWAY"
                return int.from_bytes(payload[4:8], "big")

    def close(self) -> None:
        self.writer.transport.abort()


@pytest.mark.kafka
async def test_a_ping_flood_on_a_real_connection_gets_goaway_enhance_your_calm(served: Served) -> None:
    client = await _RawClient.connect(served)
    try:
        # One write just past the rate (17 KB), read by the server at once (see the 16 MiB test).
        client.writer.write(b"".join(FLOODS["ping"](i) for i in range(CONTROL_FRAMES_PER_SECOND + 1)))
        assert await client.goaway_code() == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    finally:
        client.close()


@pytest.mark.kafka
async def test_a_client_that_does_not_read_stops_being_read_until_it_does(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PINGs under the flood rate, never read: the server's unsent acknowledgements stay bounded
    (it stops reading past READ_PAUSE_BACKLOG) and all are sent once the client reads."""
    monkeypatch.setattr(_h2_limits, "CONTROL_FRAMES_PER_SECOND", 10**9)  # the pause alone
    before = set(map(id, _sessions(served)))
    client = await _RawClient.connect(served, rcvbuf=4096)
    try:
        await until(lambda: any(id(s) not in before for s in _sessions(served)), "the h2 session")
        (session,) = [s for s in _sessions(served) if id(s) not in before]
        # The server's socket takes little, so its transport buffers what the client leaves unread.
        server_sock = session.transport.get_extra_info("socket")
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sent = 0
        batch = 2_000
        while not session.read_paused:
            assert sent < 1_000_000, "the server never stopped reading"
            client.writer.write(b"".join(FLOODS["ping"](sent + i) for i in range(batch)))
            sent += batch
            await until(
                lambda: session.read_paused or not client.writer.transport.get_write_buffer_size(),
                "the batch taken by the server, or its reading paused",
            )
        unsent = session.transport.get_write_buffer_size()
        # One read's worth of acknowledgements (asyncio reads up to 256 KiB) may land past the bound.
        assert unsent <= READ_PAUSE_BACKLOG + 256 * 1024, f"{unsent} bytes buffered for one client"
        acks = 0
        while acks < sent:
            kind, flags, _ = await asyncio.wait_for(client.next_frame(), WAIT_S)
            acks += kind == PING and flags == 1
        assert not session.read_paused, "reading resumed once the client read"
    finally:
        client.close()


@pytest.mark.kafka
async def test_a_16_mib_frame_header_on_a_real_connection_is_refused_before_its_body(served: Served) -> None:
    client = await _RawClient.connect(served)
    try:
        # A little of the body only: more, unread when the server closes, and its kernel resets the
        # connection (RST), which may discard the GOAWAY before this client reads it.
        client.writer.write(frame(DATA, 0, 1, b"x" * 1024, length=ANNOUNCED))
        assert await client.goaway_code() == h2.errors.ErrorCodes.FRAME_SIZE_ERROR
    finally:
        client.close()


@pytest.mark.kafka
async def test_a_closed_connection_is_freed_without_a_collection(served: Served) -> None:
    """No full collection runs (gc off): the session, its protocol and h2's connection go by
    reference counting once the socket closes, a partial frame's bytes with them."""
    before = set(map(id, _sessions(served)))
    gc.disable()
    try:
        client = await _RawClient.connect(served)
        client.writer.write(frame(DATA, 0, 1, length=MAX_FRAME) + b"x" * (MAX_FRAME // 2))
        await until(lambda: any(id(s) not in before for s in _sessions(served)), "the h2 session")
        (fresh,) = [s for s in _sessions(served) if id(s) not in before]
        buffer = fresh.conn.incoming_buffer  # h2's: refers to nothing of the session
        await until(lambda: len(buffer._data) > 0, "the partial frame buffered")
        refs: list[weakref.ref[Any]] = [weakref.ref(o) for o in (fresh, fresh.protocol, fresh.conn)]
        del fresh
        client.close()
        await until(lambda: all(ref() is None for ref in refs), "the closed connection's objects freed")
        assert len(buffer._data) == 0, "the partial frame's bytes let go of"
    finally:
        gc.enable()


@pytest.mark.kafka
async def test_a_stream_past_the_limit_is_refused_and_the_connections_long_polls_are_answered(
    served: Served, kafka_topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit of max_waiters (4) streams, no headroom: 3 long polls and an unfinished request
    fill it; the 5th stream is refused alone, and the long polls are answered on a record (whose
    produce takes the 4th waiter)."""
    monkeypatch.setattr(_h2_long_poll, "STREAM_HEADROOM", 0)
    topic = kafka_topic_factory(1)
    records = f"/topics/{topic}/partitions/0/records"
    async with httpx.AsyncClient(base_url=served.url, timeout=WAIT_S) as http:
        warm = await http.get(records, params={"offset": 0, "max_wait_ms": 0})
        assert warm.status_code == 200, warm.text
    client = await _RawClient.connect(served)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.data_to_send()  # the raw client sent the preface already
    conn.receive_data(b"")
    try:
        poll = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"127.0.0.1")]
        path = f"{records}?offset=0&max_wait_ms=30000".encode()
        polls: list[int] = []
        for _ in range(3):
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, [*poll, (b":path", path)], end_stream=True)
            polls.append(stream_id)
        unfinished = conn.get_next_available_stream_id()
        conn.send_headers(unfinished, POST, end_stream=False)
        client.writer.write(conn.data_to_send())
        await until(lambda: served.pending == 3, "3 long polls waiting")
        refused = conn.get_next_available_stream_id()
        conn.send_headers(refused, POST, end_stream=False)
        client.writer.write(conn.data_to_send())
        events: list[h2.events.Event] = []

        async def read_until(done: Any) -> None:
            while not done():
                events.extend(conn.receive_data(await asyncio.wait_for(client.reader.read(65536), WAIT_S)))
                client.writer.write(conn.data_to_send())

        resets = lambda: {e.stream_id: e.error_code for e in events if isinstance(e, h2.events.StreamReset)}  # noqa: E731
        await read_until(lambda: refused in resets())
        assert resets()[refused] == h2.errors.ErrorCodes.REFUSED_STREAM
        assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
        assert served.pending == 3, "the connection's long polls still wait"
        (session,) = [s for s in _sessions(served) if set(polls) <= set(s.waiters)]
        assert unfinished in session.requests, "and its unfinished request is still held"
        async with httpx.AsyncClient(base_url=served.url, timeout=WAIT_S) as http:
            produced = await http.post(f"/topics/{topic}/records", json={"records": [{"value": "v"}]})
            assert produced.status_code == 200, produced.text
        ended = lambda: {e.stream_id for e in events if isinstance(e, h2.events.StreamEnded)}  # noqa: E731
        await read_until(lambda: set(polls) <= ended())
        statuses = {
            e.stream_id: dict(e.headers)[b":status"]
            for e in events
            if isinstance(e, h2.events.ResponseReceived)
        }
        assert [statuses[s] for s in polls] == [b"200"] * 3
    finally:
        client.close()
