"""What an HTTP/2 client's bytes may cost the service before ``h2`` has made sense of them.

Why a room of its own: ``h2`` trusts its input more than a server facing hostile clients may.
Its :class:`h2.frame_buffer.FrameBuffer` buffers a frame whole before it compares the frame's
length with the advertised SETTINGS_MAX_FRAME_SIZE, so a header announcing 16 MiB followed by
15 MiB of body held 15 MiB per connection (the attack report, item 7); it acknowledges every
PING and SETTINGS at once, however many arrive (the CVE-2019-9512 class, item 2); its HPACK
decoder enforces its own 64 KiB header-list default, not the SETTINGS_MAX_HEADER_LIST_SIZE the
service advertises (item 12). Here, pure and without sockets:

* :class:`InboundFrames` walks the 9-byte frame headers of the byte stream as it arrives, before
  ``h2`` buffers anything: it reports the first frame longer than the advertised maximum (its
  header alone is enough: the body is never held) and counts the frames a flood is made of
  (:func:`is_flood_frame`). Worked example, max frame size 16,384, reads of 5 and 20 bytes::

      read 1: 00 00 08 06 00        -> partial header kept (5 bytes), nothing counted yet
      read 2: 00 00 00 00 | 8 bytes of PING payload | 00 40 01 00 00 00 00 00 01 ...
              -> header complete: PING, length 8, no ACK: 1 flood frame; its 8 bytes skipped;
                 next header: length 0x004001 = 16,385 > 16,384: oversized, reported at once.

* :class:`BoundedHeaderDecoder` decodes every header block whole — HPACK's dynamic table is
  shared by the connection's streams, so a block cut short would leave the table out of step
  with the client's and corrupt every later block (RFC 9113 §4.3) — but keeps none of a list
  past SETTINGS_MAX_HEADER_LIST_SIZE: it hands back a stand-in and flags the block, and the
  stream is refused on its own (431).

Concurrency contract: one instance per connection, used on the event loop's thread only, as the
:class:`._long_poll.H2Session` that owns them.
"""

from __future__ import annotations

from collections.abc import Iterable

import hpack
from hpack.exceptions import HPACKDecodingError
from hpack.struct import HeaderTuple
from hpack.table import table_entry_size

__all__ = [
    "FRAME_HEADER_BYTES",
    "BoundedHeaderDecoder",
    "InboundFrames",
    "is_flood_frame",
    "parse_frame_header",
]

FRAME_HEADER_BYTES = 9  # RFC 9113 §4.1: length (24 bits), type, flags, stream id (31 bits + 1)
# Frame types and flags (RFC 9113 §6) a flood is made of.
DATA, HEADERS, PRIORITY, SETTINGS, PING, CONTINUATION = 0x0, 0x1, 0x2, 0x4, 0x6, 0x9
ACK = 0x1  # SETTINGS and PING: an acknowledgement, which the service never has to answer
END_STREAM = 0x1  # DATA and HEADERS
END_HEADERS = 0x4  # HEADERS and CONTINUATION


def parse_frame_header(head: bytes | bytearray | memoryview, at: int = 0) -> tuple[int, int, int]:
    """(length, type, flags) of the 9-byte frame header starting at ``head[at]``."""
    length = head[at] << 16 | head[at + 1] << 8 | head[at + 2]
    return length, head[at + 3], head[at + 4]


def is_flood_frame(kind: int, flags: int, length: int) -> bool:
    """Whether a frame is one a flood is made of: the service must do work for it (an
    acknowledgement to write, a state to update) and the client gets nothing a request needs.

    PING and SETTINGS that are not acknowledgements (each makes the service write an ACK: the
    CVE-2019-9512 "ping flood" and CVE-2019-9515 "settings flood"), PRIORITY (a frame outside
    any request: CVE-2019-9513), and empty DATA, HEADERS or CONTINUATION frames that end nothing
    (no END_STREAM, no END_HEADERS: CVE-2019-9518 "empty frames flood"). An empty DATA with
    END_STREAM ends a request, a legitimate way to finish one: not counted.
    """
    if kind in (PING, SETTINGS):
        return not flags & ACK
    if kind == PRIORITY:
        return True
    if length:
        return False
    if kind == DATA:
        return not flags & END_STREAM
    if kind == HEADERS:
        return not flags & (END_STREAM | END_HEADERS)
    if kind == CONTINUATION:
        return not flags & END_HEADERS
    return False


class InboundFrames:
    """Where the connection's byte stream is in its frames: the walk the module docstring shows.

    ``scan`` takes each read as it arrives and returns ``(flood frames, oversized length)``:
    the frames among those whose header completed in this read that :func:`is_flood_frame`
    counts, and the announced length of the first frame over ``max_frame_size`` (-1: none). Once
    one is oversized the caller closes the connection; the scanner is not to be used again.
    It holds at most 8 bytes (a header split across reads), whatever the client announces.
    """

    __slots__ = ("_body_left", "_head", "_skip")

    def __init__(self, preface_bytes: int) -> None:
        self._skip = preface_bytes  # the connection preface is not a frame (RFC 9113 §3.4)
        self._body_left = 0  # bytes of the current frame's body not arrived yet
        self._head = b""  # the start of a frame header split across reads

    def scan(self, data: bytes, max_frame_size: int) -> tuple[int, int]:
        end = len(data)
        pos = min(self._skip, end)
        self._skip -= pos
        floods = 0
        if self._head and pos < end:
            # A header split across reads: complete it (at most 8 bytes copied).
            head = self._head + data[pos : pos + FRAME_HEADER_BYTES - len(self._head)]
            pos += len(head) - len(self._head)
            if len(head) < FRAME_HEADER_BYTES:
                self._head = head
                return 0, -1
            self._head = b""
            length, kind, flags = parse_frame_header(head)
            if length > max_frame_size:
                return 0, length
            floods += is_flood_frame(kind, flags, length)
            self._body_left = length
        while pos < end:
            if self._body_left:
                skipped = min(self._body_left, end - pos)
                self._body_left -= skipped
                pos += skipped
                continue
            if end - pos < FRAME_HEADER_BYTES:
                self._head = data[pos:end]
                break
            length, kind, flags = parse_frame_header(data, pos)
            if length > max_frame_size:
                return floods, length
            floods += is_flood_frame(kind, flags, length)
            self._body_left = length
            pos += FRAME_HEADER_BYTES
        return floods, -1


class BoundedHeaderDecoder(hpack.Decoder):
    """HPACK decoding that keeps at most ``max_header_list_size`` of a header list (module docstring).

    The size is RFC 9113 §6.5.2's (each field's name and value plus 32), as ``hpack`` counts it.
    A block over it is still decoded to its end, so the dynamic table stays the client's; its
    fields are dropped as they are decoded (an indexed field costs a tuple, a literal its own
    bytes: bounded by the block, which ``h2`` bounds to 64 frames), ``oversized`` is set, and
    :attr:`stand_in` is returned in its place — a header list ``h2`` accepts for the stream, so
    the refusal stays a stream's (the session answers 431) instead of the connection's
    (``h2`` would raise DenialOfServiceError: GOAWAY for every stream of the connection).
    The caller sets ``stand_in`` before each block and clears ``oversized`` after it.
    """

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size=max_header_list_size)
        self.oversized = False
        self.stand_in: list[tuple[bytes, bytes]] = []

    def decode(self, data: bytes, raw: bool = False) -> Iterable[HeaderTuple]:
        # hpack.Decoder.decode's walk (hpack 4.2), keeping the fields only while within the limit.
        view = memoryview(data)
        headers: list[HeaderTuple] = []
        inflated = 0
        pos = 0
        limit = self.max_header_list_size
        oversized = False
        seen_field = False
        while pos < len(data):
            current = data[pos]
            if current & 0x80:
                header, consumed = self._decode_indexed(view[pos:])
            elif current & 0x40:
                header, consumed = self._decode_literal_index(view[pos:])
            elif current & 0x20:
                if seen_field:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                consumed = self._update_encoding_context(view[pos:])
                header = None
            else:
                header, consumed = self._decode_literal_no_index(view[pos:])
            pos += consumed
            if header is None:
                continue
            seen_field = True
            if oversized:
                continue  # decoded for the table's sake only: dropped
            inflated += table_entry_size(header[0], header[1])
            if inflated > limit:
                oversized = True
                headers.clear()
            else:
                headers.append(header)
        self._assert_valid_table_size()
        if oversized:
            self.oversized = True
            return [HeaderTuple(name, value) for name, value in self.stand_in]
        # As hpack's own: a literal's name and value may be views of ``data``; its kind (never
        # indexed or not) is kept. ``h2`` always asks for raw bytes.
        if raw:
            return [type(h)(bytes(h[0]), bytes(h[1])) for h in headers]
        return [type(h)(bytes(h[0]).decode("utf-8"), bytes(h[1]).decode("utf-8")) for h in headers]
