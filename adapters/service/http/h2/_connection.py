"""H2ServerConnection: ``h2``'s connection, patched where a server facing hostile clients needs it.

``h2`` counts the open streams by walking every stream it holds (O(streams) per new stream), and
answers a stream past SETTINGS_MAX_CONCURRENT_STREAMS, or a header list past its size, with a
connection error that drops every long poll of the connection. Here the count is O(1) amortised
and both are errors of their stream alone (RST_STREAM REFUSED_STREAM; a 431 answered by the
session, :class:`HeaderListTooLarge`).
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events

from ._inbound import BoundedHeaderDecoder

__all__ = ["STREAM_WALK_SLACK", "H2ServerConnection", "HeaderListTooLarge"]

# Streams a connection may hold past twice those left after its last walk before walking again
# (H2ServerConnection): closed ones wait at most that long to be dropped.
STREAM_WALK_SLACK = 64


class H2ServerConnection(h2.connection.H2Connection):
    """``h2``'s connection whose check of SETTINGS_MAX_CONCURRENT_STREAMS does not walk every stream.

    ``h2`` counts the open streams for each new one by walking all it holds (dropping the closed
    ones as it goes): 1,000 streams opened on a connection were 500,000 steps, a third of the
    loop's time registering 10,000 long polls (cProfile) — adding a waiter cost O(its connection's
    streams). The count only decides whether one more stream is over the limit, and the streams
    held bound the open ones from above: below the limit, that bound is the answer (no stream is
    refused that ``h2`` would accept, nor accepted that it would refuse); at the limit, ``h2``'s
    exact walk decides. The walk also runs whenever the streams held have doubled since the last
    one (plus :data:`STREAM_WALK_SLACK`), so closed streams are still dropped, at O(1) amortised.
    """

    _held_after_walk = 0  # streams held right after the last walk
    _counted = False  # inside _receive_headers_frame: the stream limit was decided already
    refused = 0  # streams refused past SETTINGS_MAX_CONCURRENT_STREAMS (the session counts them as a flood)

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        # h2's decoder enforces its own 64 KiB default, not the list size advertised (the session
        # sets that); this one refuses an oversized list as a stream's error (_h2_inbound).
        self.decoder = BoundedHeaderDecoder(self.DEFAULT_MAX_HEADER_LIST_SIZE)

    @property
    def open_inbound_streams(self) -> int:
        if self._counted:
            return 0  # decided by _receive_headers_frame before it let h2 open the stream
        held = len(self.streams)
        if (
            held < self.local_settings.max_concurrent_streams
            and held < 2 * self._held_after_walk + STREAM_WALK_SLACK
        ):
            return held  # >= the open ones, and under the limit: the answer h2 needs (class docstring)
        count = super().open_inbound_streams
        self._held_after_walk = len(self.streams)
        return count

    def _receive_headers_frame(self, frame: Any) -> tuple[list[Any], list[h2.events.Event]]:
        """As ``h2``'s, but a stream past the limit and a header list past its size are stream errors.

        ``h2`` raises TooManyStreamsError for a stream past SETTINGS_MAX_CONCURRENT_STREAMS: a
        connection error, GOAWAY, and every waiting long poll of the connection dropped. RFC 9113
        §5.1.2 wants that stream refused alone (RST_STREAM REFUSED_STREAM: the client may retry
        it). Its header block is still decoded (the HPACK table is the connection's, §4.3), so
        the stream is opened as ``h2`` would open it, then reset, and its events dropped.
        A header list over SETTINGS_MAX_HEADER_LIST_SIZE (:class:`BoundedHeaderDecoder`) becomes a
        :class:`HeaderListTooLarge` in place of its request's events: the session answers 431.
        """
        stream_id = frame.stream_id
        new = stream_id not in self.streams
        refuse = new and self.open_inbound_streams + 1 > self.local_settings.max_concurrent_streams
        decoder = self.decoder
        assert isinstance(decoder, BoundedHeaderDecoder), "set in __init__; test_h2_hostile_clients"
        # A new stream's oversized list stands in as a minimal valid request (h2 validates it);
        # trailers (the stream exists) as no fields at all.
        decoder.stand_in = _STAND_IN_REQUEST if new else []
        self._counted = True
        try:
            frames, events = super()._receive_headers_frame(frame)
        finally:
            self._counted = False
            oversized, decoder.oversized = decoder.oversized, False
        if refuse:
            self.refused += 1
            self.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return frames, []
        if oversized:
            return frames, [HeaderListTooLarge(stream_id, "END_STREAM" in frame.flags)]
        return frames, events


# What an oversized request's header list is replaced by inside h2 (never served: the session
# answers HeaderListTooLarge instead): the fewest fields RFC 9113 §8.3.1 requires of a request,
# and the :authority h2 insists on.
_STAND_IN_REQUEST = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"-"), (b":path", b"/")]


class HeaderListTooLarge(h2.events.Event):
    """A request's (or its trailers') header list over SETTINGS_MAX_HEADER_LIST_SIZE, decoded and
    dropped; in place of the RequestReceived / TrailersReceived (and StreamEnded) h2 would give."""

    def __init__(self, stream_id: int, stream_ended: bool) -> None:
        self.stream_id = stream_id
        self.stream_ended = stream_ended  # the client sent its whole request: no RST_STREAM needed
