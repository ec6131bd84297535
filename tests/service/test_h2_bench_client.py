"""``purgatory bench fanout --http2``'s client: its minimal frame reader against the ``h2`` library.

Without sockets: the client's connection talks to a server-side ``h2.connection.H2Connection``
through byte buffers, so the test decides every frame (CONTINUATION, padding, a body larger than
a stream's window, PING, RST_STREAM, GOAWAY) and how the bytes are cut into reads. The answers
on the real service are compared with the ``h2`` library's client in tests/service/test_h2.py.
"""

from __future__ import annotations

from collections.abc import Callable

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
from purgatory.tools.bench.service.h2_client import H2LongPoll, _H2Connection

from .conftest import RecordingTransport

SMALL = b'{"outcome":"COMPLETED","records":[]}'
LARGE = bytes(range(256)) * 600  # 153,600 B: several DATA frames, past a stream's 65,535 window
LONG_VALUE = b"x" * 20_000  # a header past one frame (16,384): HEADERS + CONTINUATION


class _Exchange:
    """The client's connection and an ``h2`` server, bytes carried between them by :meth:`pump`."""

    def __init__(self, streams: int, cut: Callable[[bytes], list[bytes]]) -> None:
        self.polls = [H2LongPoll(0) for _ in range(streams)]
        self.client = _H2Connection(b"test", [(f"/r?i={i}".encode(), p) for i, p in enumerate(self.polls)])
        self.wire = RecordingTransport()  # what the client wrote, for the server to read
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.server.initiate_connection()
        self.cut = cut  # how the server's bytes are split into the client's reads
        self.requests: list[int] = []
        self.events: list[h2.events.Event] = []
        self.client.connection_made(self.wire)  # type: ignore[arg-type]
        self.pump()

    def pump(self) -> None:
        """Carry bytes both ways until neither side has anything to say."""
        while True:
            sent = self.wire.take()
            if sent:
                for event in self.server.receive_data(sent):
                    self.events.append(event)
                    if isinstance(event, h2.events.RequestReceived):
                        self.requests.append(event.stream_id)
            answer = self.server.data_to_send()
            for piece in self.cut(answer):
                self.client.data_received(piece)
            if not sent and not answer:
                return

    def respond(
        self, stream_id: int, status: int, body: bytes, *, pad: int | None = None, long: bool = True
    ) -> None:
        headers = [(":status", str(status)), ("content-length", str(len(body)))]
        if long:  # past one frame; and past the dynamic table's size, so never indexed
            headers.append(("x-long", LONG_VALUE.decode()))
        self.server.send_headers(stream_id, headers, end_stream=not body)
        view = memoryview(body)
        while view:
            size = min(
                self.server.local_flow_control_window(stream_id),
                self.server.max_outbound_frame_size - 256,
                len(view),
            )
            if size == 0:  # wait for the client's WINDOW_UPDATE
                self.pump()
                continue
            self.server.send_data(stream_id, bytes(view[:size]), end_stream=size == len(view), pad_length=pad)
            view = view[size:]
        self.pump()


def _whole(data: bytes) -> list[bytes]:
    return [data] if data else []


def _bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


@pytest.mark.parametrize("cut", [_whole, _bytewise], ids=["whole-reads", "one-byte-reads"])
async def test_answers_are_read_whole_whatever_the_frames_and_the_reads(
    cut: Callable[[bytes], list[bytes]],
) -> None:
    exchange = _Exchange(5, cut)
    assert exchange.requests == [1, 3, 5, 7, 9], "stream 2i+1 is request i, all sent at once"
    small, padded, large, reset, headers_only = exchange.polls
    exchange.respond(1, 200, SMALL)
    exchange.respond(3, 200, SMALL, pad=17)  # padded DATA (and a padded-free HEADERS before it)
    exchange.respond(5, 200, LARGE)  # several DATA frames; the stream's window given back on the way
    exchange.server.reset_stream(7, h2.errors.ErrorCodes.INTERNAL_ERROR)
    exchange.respond(9, 204, b"")  # HEADERS with END_STREAM, no DATA
    exchange.pump()
    assert (small.status, small.body) == (200, SMALL)
    assert (padded.status, padded.body) == (200, SMALL), "padding is not body"
    assert (large.status, large.body) == (200, LARGE), "pieces joined in order"
    assert reset.status == -2 and reset.answered_ns, "reset by the server: counted as such"
    assert (headers_only.status, headers_only.body) == (204, b"")
    assert all(p.answered_ns for p in exchange.polls)
    assert not exchange.client.bodies and not exchange.client.statuses, "nothing left per stream"


async def test_settings_and_ping_are_acknowledged_and_windows_given_back() -> None:
    exchange = _Exchange(1, _whole)
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in exchange.events), (
        "the server's SETTINGS acked"
    )
    exchange.server.ping(b"12345678")
    exchange.pump()
    acks = [e for e in exchange.events if isinstance(e, h2.events.PingAckReceived)]
    assert [a.ping_data for a in acks] == [b"12345678"]
    window = exchange.server.local_flow_control_window(1)
    exchange.respond(1, 200, LARGE)
    assert exchange.polls[0].body == LARGE
    # Every DATA byte given back to the connection (its window stays where the client opened it).
    assert exchange.server.outbound_flow_control_window >= window


async def test_a_goaway_ends_the_streams_it_leaves_out_and_a_lost_connection_the_rest() -> None:
    exchange = _Exchange(3, _whole)
    exchange.respond(1, 200, SMALL)
    exchange.server.close_connection(last_stream_id=3)  # stream 5 was never processed
    exchange.pump()
    first, second, third = exchange.polls
    assert (first.status, first.body) == (200, SMALL)
    assert second.status == 0 and not second.answered_ns, "stream 3 may still be answered"
    assert third.status == -1 and third.answered_ns, "left out by GOAWAY: will never be answered"
    exchange.client.connection_lost(None)
    assert second.status == -1 and second.answered_ns


async def test_equal_blocks_are_decoded_again_while_the_dynamic_table_is_used() -> None:
    # The h2 library's server indexes headers (dynamic table): the same answer's second block is
    # other bytes, and a memo would be wrong, so every block goes through the decoder.
    exchange = _Exchange(3, _whole)
    for stream_id in (1, 3, 5):
        exchange.respond(stream_id, 200 + stream_id, SMALL, long=False)
    assert [p.status for p in exchange.polls] == [201, 203, 205]
    assert exchange.client.decoded == {}, "no memo while the connection's table holds entries"


async def test_a_block_without_indexing_is_decoded_once_and_reused() -> None:
    # As the service sends them: its table size 0 (the first block says so), then equal blocks.
    exchange = _Exchange(3, _whole)
    exchange.server.encoder.header_table_size = 0
    for stream_id in (1, 3, 5):
        exchange.server.send_headers(stream_id, [(":status", "200")], end_stream=True)
        exchange.pump()
    assert [p.status for p in exchange.polls] == [200, 200, 200]
    assert list(exchange.client.decoded.values()) == [200], "one block, decoded once"


async def test_a_frame_split_across_reads_is_answered_once_whole() -> None:
    connection = _H2Connection(b"test", [])
    wire = RecordingTransport()
    connection.transport = wire  # type: ignore[assignment]
    ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"
    connection.data_received(ping[:7])  # the frame header cut short
    connection.data_received(ping[7:12])  # the payload cut short
    assert wire.written == b"", "nothing answered before the frame is whole"
    connection.data_received(ping[12:])
    assert wire.take() == b"\x00\x00\x08\x06\x01\x00\x00\x00\x00" + b"12345678", "PING ACK, same data"
