"""The bounds of one HTTP/2 connection, each against a way a client can make the service work or
hold memory for nothing (the attack reports of issue 31), and the counters that enforce the
per-second ones (:class:`AbuseCounters`: control-frame floods, rapid reset).
"""

from __future__ import annotations

from collections import deque

__all__ = [
    "BUFFERED_BODY_BYTES",
    "CONTROL_FRAMES_PER_SECOND",
    "H2_IDLE_TIMEOUT_S",
    "MAX_BRIDGED_BODY_BYTES",
    "MAX_DATA_FRAME",
    "MAX_INCOMPLETE_REQUESTS",
    "RAPID_RESETS_PER_SECOND",
    "RAPID_RESET_AGE_S",
    "READ_PAUSE_BACKLOG",
    "STREAM_HEADROOM",
    "WRITE_BACKLOG",
    "AbuseCounters",
]

# A bridged request's body is read in full before the app runs: bounded (the produce route's own
# limit is 1 MiB; the margin lets the app give its own 413 with the field named).
MAX_BRIDGED_BODY_BYTES = 2 * 1024 * 1024
# A connection's answers are handed to the transport only while less than this waits unsent in
# its buffers. The client's flow-control windows alone do not bound it (a client may announce
# 2^31-1 and read nothing), and asyncio copies what the socket does not take: 1,000 streams'
# 21 MB answers would be 21 GB of copies (the memory-runaway report). The bodies stay shared.
WRITE_BACKLOG = 256 * 1024
# A connection whose transport holds more than this unsent is no longer read from until the
# transport drains (resume_writing): what the service writes without being asked by a request —
# PING and SETTINGS acknowledgements, RST_STREAMs, WINDOW_UPDATEs — is otherwise bounded only by
# what the client sends, and a client that sends without reading made the service buffer every
# acknowledgement (2,000,000 PINGs: +29 MB; the CVE-2019-9512 class). Twice WRITE_BACKLOG so the
# answers, which stop at WRITE_BACKLOG, never pause it alone: only traffic the client drives does.
READ_PAUSE_BACKLOG = 2 * WRITE_BACKLOG
# The largest DATA frame written (a client may allow 16 MiB ones): what one frame may take the
# connection's buffers past WRITE_BACKLOG.
MAX_DATA_FRAME = 64 * 1024
# Frames a client may send within one second that the service must act on while no request is
# served by them (PING and SETTINGS to acknowledge, PRIORITY, empty DATA/HEADERS/CONTINUATION:
# _h2_inbound.is_flood_frame), plus streams refused past SETTINGS_MAX_CONCURRENT_STREAMS, before
# its connection is closed with GOAWAY ENHANCE_YOUR_CALM. Clients send a handful (a SETTINGS at
# the start, a keep-alive PING every few seconds); 10,000 a second were acknowledged before.
CONTROL_FRAMES_PER_SECOND = 1_000
# A connection's streams whose request has not ended yet (HEADERS without END_STREAM, a body
# still arriving): past this many a new one is refused (RST_STREAM REFUSED_STREAM: safe to retry).
# A long poll ends its request with its HEADERS, so it never counts; this bounds what one
# connection holds of requests that never finish (their header fields: at most
# service.max_header_bytes each). HTTP/1.1 holds one such request per connection.
MAX_INCOMPLETE_REQUESTS = 100
# Request-body bytes one connection buffers before its client's flow-control window is no longer
# given back: past this the client can send at most the connection's window (64 KiB) more until
# a request ends, is refused or times out. Without it the window went back at once and one
# connection could buffer MAX_BRIDGED_BODY_BYTES on each of its ~60,000 streams.
BUFFERED_BODY_BYTES = 8 * 1024 * 1024
# Streams a client may reset within one second while they are still being served (a waiting
# long poll, a request arriving, a bridged exchange) and younger than RAPID_RESET_AGE_S, before
# its connection is closed with GOAWAY ENHANCE_YOUR_CALM: each such stream cost the service a
# request's work (parse, checks, an operation made and cancelled), and opening then resetting
# streams at once costs the client nothing ("rapid reset", CVE-2023-44487). A proxy cancelling
# long polls its own clients gave up on resets streams that have waited: those never count.
RAPID_RESETS_PER_SECOND = 1_000
RAPID_RESET_AGE_S = 1.0
# Granularity of a stream's age: the highest stream id opened is noted once per this long.
_STREAM_MARK_S = 0.25
# A connection that opened no stream and holds none for this long is closed (GOAWAY NO_ERROR):
# HTTP/1.1's idle connections close after uvicorn's keep-alive timeout, and an HTTP/2 one held a
# socket forever (PINGs do not count). Long enough that a client between long polls keeps it.
H2_IDLE_TIMEOUT_S = 60.0
# SETTINGS_MAX_CONCURRENT_STREAMS is the process's waiter budget plus this: a client that has
# filled the budget can still open streams and hear 429 + Retry-After (and reach /healthz),
# instead of queueing unseen in its own connection pool.
STREAM_HEADROOM = 100


class AbuseCounters:
    """Per connection: flood frames and resets of young served streams, counted per second.

    Stream ages are kept without a timestamp per stream: ``[time, highest id opened since]`` every
    :data:`_STREAM_MARK_S`; ids up to ``old_id`` were opened at least :data:`RAPID_RESET_AGE_S` ago
    (stream ids only grow on a connection).
    """

    __slots__ = ("_floods", "_floods_since", "_id_marks", "_old_id", "_resets", "_resets_since")

    def __init__(self) -> None:
        self._floods_since = 0.0  # start of the current second of counted flood frames
        self._floods = 0
        self._resets_since = 0.0  # start of the current second of counted resets (rapid reset)
        self._resets = 0
        self._id_marks: deque[list[float]] = deque()
        self._old_id = 0

    def flood(self, frames: int, now: float) -> int:
        """Count ``frames`` flood frames: this second's count once past CONTROL_FRAMES_PER_SECOND, else 0."""
        if now - self._floods_since >= 1.0:
            self._floods_since, self._floods = now, 0
        self._floods += frames
        return self._floods if self._floods > CONTROL_FRAMES_PER_SECOND else 0

    def opened(self, stream_id: int, now: float) -> None:
        """Note a stream opened now (its age, for :meth:`young_reset`)."""
        marks = self._id_marks
        if marks and now - marks[-1][0] < _STREAM_MARK_S:
            marks[-1][1] = stream_id
        else:
            marks.append([now, stream_id])
            self._age_marks(now)

    def young_reset(self, stream_id: int, now: float) -> int:
        """Count a reset of a served stream: this second's count of young ones once past
        RAPID_RESETS_PER_SECOND, else 0 (a stream served for a while is a client giving up)."""
        self._age_marks(now)
        if stream_id <= self._old_id:
            return 0
        if now - self._resets_since >= 1.0:
            self._resets_since, self._resets = now, 0
        self._resets += 1
        return self._resets if self._resets > RAPID_RESETS_PER_SECOND else 0

    def _age_marks(self, now: float) -> None:
        marks = self._id_marks
        while marks and marks[0][0] + _STREAM_MARK_S <= now - RAPID_RESET_AGE_S:
            self._old_id = int(marks.popleft()[1])
