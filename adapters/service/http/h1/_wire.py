"""What the HTTP/1.1 fast path writes: the bytes uvicorn and h11 would write for a response.

The fast path writes its answers itself, not through h11 (:mod:`._long_poll`), so the status
line, uvicorn's default headers, the response's headers, h11's ``Connection: close`` and the
body are put together here exactly as they would (tests/service/test_long_poll.py compares the
bytes), and large answers are written a piece (:data:`ANSWER_CHUNK`) at a time.
"""

from __future__ import annotations

from starlette.responses import Response
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES

from ...answers._render import fetch_body_response

__all__ = ["ANSWER_CHUNK", "http11_head", "http11_ok", "http11_response"]

# An answer is handed to the transport at most this much at a time, and the next piece only once
# the transport's buffer is empty again. asyncio (3.11) *copies* what the socket does not take at
# once into a per-connection buffer: a whole 21 MB answer shared by 1,000 slow or idle clients
# was 21 GB of copies (tools/bench/service/min_bytes_flood.py, the memory-runaway report). Piece by
# piece, a connection's own bytes stay under one chunk; the shared answer is held once.
ANSWER_CHUNK = 64 * 1024


# What h11 adds last to a response on a connection that closes after it (its own spelling).
_CLOSE_HEADER = (b"Connection", b"close")


def http11_response(
    response: Response, default_headers: list[tuple[bytes, bytes]], *, close: bool = False
) -> bytes:
    """The bytes uvicorn and h11 write for ``response`` on an HTTP/1.1 connection.

    Status line with uvicorn's reason phrase, uvicorn's default headers (``date``, ``server``),
    the response's headers in order, ``Connection: close`` when the connection closes after it
    (``close``: the request asked to, or was HTTP/1.0), a blank line, the body (framed by its
    Content-Length).
    """
    return http11_head(response, default_headers, close=close) + bytes(response.body)


def http11_head(
    response: Response, default_headers: list[tuple[bytes, bytes]], *, close: bool = False
) -> bytes:
    """:func:`http11_response` without the body: the status line, the headers and the blank line."""
    status = response.status_code
    head = [b"HTTP/1.1 %d %s\r\n" % (status, STATUS_PHRASES[status])]
    closing = (_CLOSE_HEADER,) if close else ()
    head += [b"%s: %s\r\n" % header for header in (*default_headers, *response.raw_headers, *closing)]
    head.append(b"\r\n")
    return b"".join(head)


def http11_ok(body: bytes, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A long poll's 200 as HTTP/1.1 bytes (a :class:`...answers._shared.SharedAnswer` keeps them)."""
    return http11_response(fetch_body_response(body), default_headers)
