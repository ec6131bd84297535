"""Shared HTTP/2 answer frames (:mod:`._h2_answers`): the bytes and the ``h2`` state they leave.

Without sockets or Kafka: a server-side ``h2`` connection (as the service's session sets it up:
the shared header encoder) and the ``h2`` library's client, bytes carried between them. Each
answer written as shared frames is compared with the same answer sent through ``h2``
(``send_headers`` + ``send_data``) on a twin connection: the client reads the same, and the
server's stream state and send windows are the same afterwards.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
from h2.stream import StreamClosedBy, StreamState
from purgatory.adapters.service.answers._shared import SharedAnswer
from purgatory.adapters.service.http.h2._answers import (
    SharedFrames,
    SharedHeaderEncoder,
    plain_answers_allowed,
    record_plain_stream,
)

BODY = b'{"topic":"t","partition":0,"outcome":"COMPLETED","records":[]}'
DEFAULT_HEADERS = [(b"date", b"Tue, 24 Nov 2026 22:00:00 GMT"), (b"server", b"uvicorn")]


class _Pair:
    """A client and a server connection of the ``h2`` library, ``streams`` GETs sent and received."""

    def __init__(self, streams: int) -> None:
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.server = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False, header_encoding=None, validate_outbound_headers=False
            )
        )
        self.server.encoder = SharedHeaderEncoder()
        self.client.initiate_connection()
        self.server.initiate_connection()
        self.stream_ids = []
        for _ in range(streams):
            stream_id = self.client.get_next_available_stream_id()
            request = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"t"), (b":path", b"/r")]
            self.client.send_headers(stream_id, request, end_stream=True)
            self.stream_ids.append(stream_id)
        self.client_events: list[h2.events.Event] = []
        self.to_client(b"")

    def to_client(self, written: bytes) -> None:
        """The server's bytes (``written`` past h2, then h2's own) to the client, its replies back."""
        self.server.receive_data(self.client.data_to_send())
        self.client_events += self.client.receive_data(self.server.data_to_send() + written)
        self.server.receive_data(self.client.data_to_send())

    def answers(self) -> dict[int, tuple[dict[bytes, bytes], bytes, bool]]:
        """Per stream: the response headers, the body and whether the stream ended."""
        out: dict[int, tuple[dict[bytes, bytes], bytes, bool]] = {}
        for event in self.client_events:
            if isinstance(event, h2.events.ResponseReceived):
                out[event.stream_id] = (dict(event.headers or ()), b"", False)  # type: ignore[arg-type]
            elif isinstance(event, h2.events.DataReceived):
                headers, body, ended = out[event.stream_id]
                out[event.stream_id] = (headers, body + (event.data or b""), ended)
            elif isinstance(event, h2.events.StreamEnded):
                headers, body, ended = out[event.stream_id]
                out[event.stream_id] = (headers, body, True)
        return out


def _through_h2(pair: _Pair, stream_id: int, body: bytes) -> None:
    headers = [(b":status", b"200"), *DEFAULT_HEADERS, (b"content-length", str(len(body)).encode())]
    headers.append((b"content-type", b"application/json"))
    pair.server.send_headers(stream_id, headers, end_stream=not body)
    if body:
        pair.server.send_data(stream_id, body, end_stream=True)
    pair.to_client(b"")


def _shared(pair: _Pair, shared: SharedFrames, stream_id: int, body: bytes) -> bool:
    frames = shared.frames_for(body, DEFAULT_HEADERS)
    server = pair.server
    stream = server.streams.get(stream_id)
    if not (plain_answers_allowed(server) and record_plain_stream(server, stream, frames)):
        return False
    out = bytearray()
    frames.write_to(out, stream_id)
    pair.to_client(bytes(out))
    return True


@pytest.mark.parametrize("body", [BODY, b""], ids=["with-body", "headers-only"])
def test_shared_frames_read_and_leave_h2_as_send_headers_and_send_data_do(body: bytes) -> None:
    shared, via_h2 = _Pair(3), _Pair(3)
    answer = SharedFrames()
    first, *rest = shared.stream_ids
    assert not _shared(shared, answer, first, body), "the connection's first block goes through h2"
    _through_h2(shared, first, body)  # ... carrying HPACK's table-size update
    assert isinstance(shared.server.encoder, SharedHeaderEncoder) and shared.server.encoder.first_block_sent
    _through_h2(via_h2, first, body)
    for stream_id in rest:
        assert _shared(shared, answer, stream_id, body), "later answers: shared frames"
        _through_h2(via_h2, stream_id, body)
    assert shared.answers() == via_h2.answers(), "the client reads the same answers"
    for stream_id in rest:
        ours, theirs = shared.server.streams[stream_id], via_h2.server.streams[stream_id]
        assert ours.state_machine.state is theirs.state_machine.state is StreamState.CLOSED
        assert ours.closed_by is theirs.closed_by is StreamClosedBy.SEND_END_STREAM
        assert ours.outbound_flow_control_window == theirs.outbound_flow_control_window
    assert shared.server.outbound_flow_control_window == via_h2.server.outbound_flow_control_window
    assert shared.server.open_inbound_streams == 0, "closed streams leave h2's count as its own do"


def test_an_answer_past_a_send_window_goes_through_h2() -> None:
    pair = _Pair(2)
    answer = SharedFrames()
    first, second = pair.stream_ids
    _through_h2(pair, first, BODY)
    pair.server.outbound_flow_control_window = len(BODY) - 1  # as after other answers, no WINDOW_UPDATE yet
    assert not _shared(pair, answer, second, BODY), "would overrun the connection's window"
    assert pair.server.streams[second].state_machine.state is StreamState.HALF_CLOSED_REMOTE, (
        "nothing recorded"
    )
    assert pair.server.outbound_flow_control_window == len(BODY) - 1


def test_a_stream_no_longer_waiting_is_not_answered() -> None:
    pair = _Pair(2)
    answer = SharedFrames()
    first, second = pair.stream_ids
    _through_h2(pair, first, BODY)
    pair.client.reset_stream(second, h2.errors.ErrorCodes.CANCEL)
    pair.to_client(b"")
    assert not _shared(pair, answer, second, BODY), "reset by the client: not half-closed any more"
    assert not _shared(pair, answer, 99, BODY), "a stream h2 does not hold"


@pytest.mark.parametrize("kind", ["window-update", "rst-stream"])
def test_frames_the_client_sends_on_an_answered_stream_are_handled_as_h2_handles_its_own(kind: str) -> None:
    """A WINDOW_UPDATE or RST_STREAM racing the answer: whatever h2 does for a stream it closed itself."""
    outcomes = []
    for through_h2 in (False, True):
        pair = _Pair(3)
        answer = SharedFrames()
        first, second, third = pair.stream_ids
        _through_h2(pair, first, BODY)
        if through_h2:
            _through_h2(pair, second, BODY)
        else:
            assert _shared(pair, answer, second, BODY)
        if kind == "window-update":
            frame = b"\x00\x00\x04\x08\x00" + second.to_bytes(4, "big") + (1000).to_bytes(4, "big")
        else:
            frame = b"\x00\x00\x04\x03\x00" + second.to_bytes(4, "big") + (8).to_bytes(4, "big")  # CANCEL
        events = pair.server.receive_data(frame)
        outcomes.append(([type(e).__name__ for e in events], pair.server.data_to_send()))
        assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
        if not through_h2:
            assert _shared(pair, answer, third, BODY), "the connection goes on"
            assert all(ended for _, _, ended in pair.answers().values())
    assert outcomes[0] == outcomes[1], "the same events and the same bytes back as for h2's own answer"


def test_the_shared_frames_change_with_the_body_and_the_date() -> None:
    """Built once per operation's answer and Date (SharedAnswer.http2), each body its own frames."""
    frames = SharedFrames()
    answer = SharedAnswer(BODY)
    one = answer.http2(DEFAULT_HEADERS, frames.frames_for)
    assert answer.http2(DEFAULT_HEADERS, frames.frames_for) is one, "built once for the burst"
    other_body = SharedAnswer(BODY + b" ").http2(DEFAULT_HEADERS, frames.frames_for)
    assert other_body is not one and other_body.body_size == len(BODY) + 1
    next_second = [(b"date", b"Tue, 24 Nov 2026 22:00:01 GMT"), (b"server", b"uvicorn")]
    later = answer.http2(next_second, frames.frames_for)
    assert later is not one and later.tail == one.tail
