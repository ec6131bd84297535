"""HTTP/2 answers of the long-poll route as shared frames: the stream id is all that differs.

Why: a record appended to a partition answers every long poll waiting there with the same 200 —
same headers, same body bytes (:class:`...answers._shared.SharedAnswer`, one per operation).
Through the ``h2`` library each stream's answer was a ``send_headers`` and a ``send_data``: its
stream and connection state machines, its frame objects and their serialisation, ~20 µs of the
loop's time per answer (cProfile, 10,000 streams). Here the HEADERS and DATA frames of that
answer are built once, without their stream ids, and each stream's answer is those bytes with its
id written in twice.

Why it is still HTTP/2 as ``h2`` would write it:

* HPACK: the header block comes from :class:`SharedHeaderEncoder` (no dynamic table), so equal
  headers are equal bytes on every connection once the connection's first block — the one that
  carries the table-size update — has gone out through ``h2`` (:func:`plain_answers_allowed`
  refuses a connection whose first block is still to come).
* Flow control: the body is sent only if it fits the stream's and the connection's send windows
  (and one frame); both windows are debited as ``h2`` debits them, so what ``h2`` sends later on
  the connection (a blocked answer, a bridged one) stays within them.
* Stream state: the stream must be half-closed (remote) — the request ended, nothing sent yet —
  and is then recorded CLOSED by our END_STREAM, exactly the state ``send_headers`` and
  ``send_data(end_stream=True)`` leave it in, so frames the client sends on it afterwards
  (a RST_STREAM racing the answer, a WINDOW_UPDATE) are handled by ``h2`` as for any stream it
  closed itself, and ``h2`` drops it from its table as it drops its own closed streams.

Anything else (an error answer, an answer larger than a window or a frame, a connection the
client said GOAWAY on) goes through ``h2`` as before (:class:`._long_poll.H2Session`).

Concurrency contract: the event loop's thread only, as the sessions that call it.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

import h2.connection
import hpack
from h2.connection import ConnectionState
from h2.stream import StreamClosedBy, StreamState

from ...answers._render import fetch_body_response

__all__ = [
    "SharedAnswerFrames",
    "SharedFrames",
    "SharedHeaderEncoder",
    "plain_answers_allowed",
    "record_plain_stream",
]

# Distinct header lists kept encoded: a 200 differs from the next by its Date (one a second) and
# its Content-Length; a few dozen cover every answer of a burst many times over.
SHARED_HEADER_BLOCKS = 64
# The largest body sent as shared frames: RFC 9113's default frame size. A client may announce
# frames of up to 16 MiB (and windows of 2^31-1): each stream's shared frames are *copied* into
# its connection's buffer, so a 4 MB answer to 100 streams of a client that never reads was
# 400 MB there. Larger bodies go through h2, a frame at a time within the write backlog.
MAX_SHARED_BODY = 16 * 1024
DATA, HEADERS = 0x0, 0x1  # frame types (RFC 9113 §6.1, §6.2)
END_STREAM, END_HEADERS = 0x1, 0x4
# A frame header without its stream id: length (24 bits, as 16 + 8), type, flags (RFC 9113 §4.1).
_FRAME_HEAD = struct.Struct(">HBBB")


class SharedHeaderEncoder(hpack.Encoder):
    """HPACK without the dynamic table: equal header lists give equal bytes, encoded once.

    The table's size is 0 from the start (the first header block of the connection carries the
    size update, so it is encoded afresh); a peer's SETTINGS_HEADER_TABLE_SIZE is an upper bound
    an encoder may stay below (RFC 7541 §4.2), so it is kept at 0 for the connection's life. With
    nothing indexed, a block depends only on the headers: the process-wide cache holds the bytes.
    """

    blocks: OrderedDict[tuple[tuple[bytes, bytes], ...], bytes] = OrderedDict()  # every connection's

    def __init__(self) -> None:
        super().__init__()
        # The base class's setter records the change, emitted at the start of the next block.
        hpack.Encoder.header_table_size.fset(self, 0)  # type: ignore[attr-defined]

    @property
    def header_table_size(self) -> int:
        return 0

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        pass  # the peer's maximum: the table stays at 0 (class docstring)

    @property
    def first_block_sent(self) -> bool:
        """The table-size update went out: every later block is the shared bytes of its headers."""
        return not self.header_table.resized

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        if self.header_table.resized:  # the connection's first block: size update + headers
            return super().encode(headers, huffman)
        key = tuple(headers)
        blocks = self.blocks
        block = blocks.get(key)
        if block is None:
            block = super().encode(key, huffman)
            blocks[key] = block
            if len(blocks) > SHARED_HEADER_BLOCKS:
                blocks.popitem(last=False)
        return block


def _frame_head(length: int, kind: int, flags: int) -> bytes:
    return _FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags)


class SharedAnswerFrames:
    """One 200's HEADERS + DATA frames, cut where the stream id goes (twice)."""

    __slots__ = ("block_size", "body_size", "headers_head", "middle", "tail")

    def __init__(self, block: bytes, body: bytes) -> None:
        self.block_size = len(block)
        self.body_size = len(body)
        self.middle: bytes | None
        if body:
            self.headers_head = _frame_head(len(block), HEADERS, END_HEADERS)
            self.middle = block + _frame_head(len(body), DATA, END_STREAM)
            self.tail = body
        else:  # no DATA frame: the HEADERS frame (its block the tail) ends the stream
            self.headers_head = _frame_head(len(block), HEADERS, END_HEADERS | END_STREAM)
            self.middle = None
            self.tail = block

    def write_to(self, out: bytearray, stream_id: int) -> None:
        """Append the frames for ``stream_id`` (its h2 state recorded by :func:`record_plain_stream`)."""
        sid = stream_id.to_bytes(4, "big")
        out += self.headers_head
        out += sid
        if self.middle is not None:
            out += self.middle
            out += sid
        out += self.tail


class SharedFrames:
    """Builds a 200's shared frames for :meth:`...answers._shared.SharedAnswer.http2` (which keeps
    them per operation) with one process-wide encoder, and counts the streams answered with them."""

    __slots__ = ("answers", "encoder")

    def __init__(self) -> None:
        self.answers = 0  # streams answered with shared frames (tests read it)
        self.encoder = SharedHeaderEncoder()
        self.encoder.encode([])  # its table-size update spent: from now on the shared blocks

    def frames_for(self, body: bytes, default_headers: list[tuple[bytes, bytes]]) -> SharedAnswerFrames:
        headers = [(b":status", b"200"), *default_headers, *fetch_body_response(body).raw_headers]
        return SharedAnswerFrames(self.encoder.encode(headers), body)


def plain_answers_allowed(conn: h2.connection.H2Connection) -> bool:
    """The connection-wide checks before any stream's shared frames (once per batch of answers)."""
    encoder = conn.encoder
    if not (isinstance(encoder, SharedHeaderEncoder) and encoder.first_block_sent):
        return False
    # The client's GOAWAY (or ours): h2 decides what may still be sent.
    return conn.state_machine.state is not ConnectionState.CLOSED


def record_plain_stream(conn: h2.connection.H2Connection, stream: Any, frames: SharedAnswerFrames) -> bool:
    """The per-stream half: record the answer on ``stream`` (``conn.streams``' entry, or None);
    False if it must go through ``h2`` instead (nothing recorded then)."""
    if stream is None:
        return False
    machine = stream.state_machine
    if machine.state is not StreamState.HALF_CLOSED_REMOTE:
        return False
    size = frames.body_size
    limit = conn.max_outbound_frame_size
    if (
        frames.block_size > limit  # would need CONTINUATION frames
        or size > limit
        or size > MAX_SHARED_BODY
        or size > conn.outbound_flow_control_window
        or size > stream.outbound_flow_control_window
    ):
        return False
    # As send_headers + send_data(end_stream=True) leave them (h2/stream.py: response_sent,
    # send_end_stream; h2/connection.py: send_data's window debit).
    machine.headers_sent = True
    machine.state = StreamState.CLOSED
    machine.stream_closed_by = StreamClosedBy.SEND_END_STREAM
    stream.outbound_flow_control_window -= size
    conn.outbound_flow_control_window -= size
    return True
