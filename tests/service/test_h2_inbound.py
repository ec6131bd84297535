"""The frame-header walk and the bounded HPACK decoder of :mod:`._h2_inbound`, at their boundaries.

Pure: bytes in, verdicts out; no sockets, no session.
"""

from __future__ import annotations

import struct

import hpack
import pytest
from purgatory.adapters.service.http.h2._inbound import (
    CONTINUATION,
    DATA,
    HEADERS,
    PING,
    PRIORITY,
    SETTINGS,
    BoundedHeaderDecoder,
    InboundFrames,
    is_flood_frame,
    parse_frame_header,
)

MAX_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113 §6.5.2)
RST_STREAM, GOAWAY, WINDOW_UPDATE = 0x3, 0x7, 0x8


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"", length: int | None = None) -> bytes:
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload


def test_a_frame_header_is_read_as_length_type_and_flags() -> None:
    assert parse_frame_header(frame(DATA, 0x1, 1, length=0xABCDEF)) == (0xABCDEF, DATA, 0x1)
    assert parse_frame_header(b"xx" + frame(PING, 0x0, 0, b"p" * 8), 2) == (8, PING, 0)


@pytest.mark.parametrize(
    ("kind", "flags", "length", "flood"),
    [
        (PING, 0x0, 8, True),
        (PING, 0x1, 8, False),  # an acknowledgement: nothing to answer
        (SETTINGS, 0x0, 0, True),
        (SETTINGS, 0x0, 6, True),
        (SETTINGS, 0x1, 0, False),
        (PRIORITY, 0x0, 5, True),
        (DATA, 0x0, 0, True),  # empty, ends nothing
        (DATA, 0x1, 0, False),  # empty END_STREAM: a request's legitimate end
        (DATA, 0x0, 1, False),
        (HEADERS, 0x0, 0, True),
        (HEADERS, 0x4, 0, False),
        (HEADERS, 0x1, 0, False),
        (HEADERS, 0x0, 1, False),
        (CONTINUATION, 0x0, 0, True),
        (CONTINUATION, 0x4, 0, False),
        (CONTINUATION, 0x0, 1, False),
        (RST_STREAM, 0x0, 4, False),  # counted by the rapid-reset rule instead
        (GOAWAY, 0x0, 8, False),
        (WINDOW_UPDATE, 0x0, 4, False),
    ],
)
def test_flood_frames_are_those_the_service_answers_for_nothing(
    kind: int, flags: int, length: int, flood: bool
) -> None:
    assert is_flood_frame(kind, flags, length) is flood


def test_the_preface_is_skipped_and_frames_are_counted_across_reads_byte_by_byte() -> None:
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    stream = preface + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"12345678") + frame(DATA, 1, 1, b"x" * 100)
    stream += frame(PING, 1, 0, b"12345678") + frame(PRIORITY, 0, 3, b"\0" * 5)
    whole = InboundFrames(len(preface))
    assert whole.scan(stream, MAX_FRAME) == (3, -1), "SETTINGS, PING and PRIORITY; not the ACK or DATA"
    split = InboundFrames(len(preface))
    counted = 0
    for i in range(len(stream)):
        floods, oversized = split.scan(stream[i : i + 1], MAX_FRAME)
        assert oversized == -1
        counted += floods
    assert counted == 3, "the same frames, whatever the reads' boundaries"


@pytest.mark.parametrize("split_at", [0, 1, 3, 8])
def test_a_frame_one_byte_over_the_max_is_refused_from_its_header_alone(split_at: int) -> None:
    head = frame(DATA, 0, 1, length=MAX_FRAME + 1)
    scanner = InboundFrames(0)
    assert scanner.scan(frame(DATA, 0, 1, b"y" * MAX_FRAME), MAX_FRAME) == (0, -1), "exactly the max: fine"
    if split_at:
        assert scanner.scan(head[:split_at], MAX_FRAME) == (0, -1), "a partial header: not known yet"
    assert scanner.scan(head[split_at:], MAX_FRAME) == (0, MAX_FRAME + 1), "refused before any body"


def test_a_body_split_across_reads_is_skipped_and_the_next_header_read() -> None:
    scanner = InboundFrames(0)
    data = frame(DATA, 0, 1, b"z" * 1000) + frame(PING, 0, 0, b"p" * 8)
    assert scanner.scan(data[:500], MAX_FRAME) == (0, -1)
    assert scanner.scan(data[500:1005], MAX_FRAME) == (0, -1), "the body's end and half a header"
    assert scanner.scan(data[1005:], MAX_FRAME) == (1, -1)
    largest = (1 << 24) - 1  # what 24 bits announce
    assert scanner.scan(frame(DATA, 0, 1, length=largest), MAX_FRAME) == (0, largest)


def _block(headers: list[tuple[bytes, bytes]], encoder: hpack.Encoder) -> bytes:
    return encoder.encode(headers)


def test_a_header_list_at_the_limit_is_kept_and_one_byte_over_is_replaced_by_the_stand_in() -> None:
    encoder = hpack.Encoder()
    limit = 100
    decoder = BoundedHeaderDecoder(limit)
    decoder.stand_in = [(b":method", b"GET")]
    at_limit = [(b"a", b"v" * (limit - 32 - 1))]  # RFC 9113 §6.5.2: name + value + 32
    assert decoder.decode(_block(at_limit, encoder), raw=True) == at_limit and not decoder.oversized
    over = [(b"a", b"v" * (limit - 32))]
    assert decoder.decode(_block(over, encoder), raw=True) == [(b":method", b"GET")]
    assert decoder.oversized


def test_an_oversized_block_is_still_decoded_whole_so_later_blocks_decode_right() -> None:
    """The HPACK table is the connection's: a block's insertions must all happen, kept or not."""
    encoder = hpack.Encoder()
    decoder = BoundedHeaderDecoder(200)
    decoder.stand_in = []
    # Both fields are inserted into the dynamic table; the list (2 x ~140) is over 200.
    big = [(b"x-first", b"1" * 100), (b"x-second", b"2" * 100)]
    assert decoder.decode(_block(big, encoder), raw=True) == []
    assert decoder.oversized
    decoder.oversized = False
    # The encoder now refers to the second field by its table index alone.
    again = [(b"x-second", b"2" * 100)]
    block = _block(again, encoder)
    assert len(block) < 5, "encoded as an index into the dynamic table"
    assert decoder.decode(block, raw=True) == again and not decoder.oversized
