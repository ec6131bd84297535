"""Server-Sent Events: ``GET /topics/{t}/partitions/{p}/stream``, a partition's records as they arrive.

Why a room of its own: a stream is not a long poll answered once but a connection fed for as long
as the client stays, and its cost is the fan-out's: one read of a partition's new records,
rendered once as SSE bytes (:mod:`._framing`), written to every stream at that position
(:mod:`._hub`). The ASGI route and the HTTP/1.1 fast path both feed their streams from here.
"""

from ._framing import heartbeat_event, overflow_event, records_event, resume_offset
from ._hub import StreamHub, StreamSink, StreamWaits

__all__ = [
    "StreamHub",
    "StreamSink",
    "StreamWaits",
    "heartbeat_event",
    "overflow_event",
    "records_event",
    "resume_offset",
]
