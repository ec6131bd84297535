"""ASGI guards around the service: request-head limits outside, a JSON catch-all inside.

``HeaderLimits`` refuses a request whose header block has more than ``max_header_count`` fields
or more than ``max_header_bytes`` bytes with a JSON 431, before any route runs. uvicorn's h11
already refuses a head larger than its ``h11_max_incomplete_event_size`` (the server is given
``max_header_bytes``, see :mod:`..server._server`), but with a plain-text 400 and only by size; httptools
has no limit at all. This guard holds whichever parser runs, and counts fields as well.

``CatchAll`` turns an exception no route handled into a JSON 500 and keeps the connection
usable. Without it Starlette's ``ServerErrorMiddleware`` answers a plain 500 and re-raises, and
uvicorn, seeing an exception after the response started, closes the connection: the client's
next pooled request fails too. A crafted request must never get here (every refusal is a
:class:`RequestError`); :class:`UnexpectedErrors` counts the ones that did (the app keeps it as
``app.state.unexpected_errors``), and the tests assert it stays 0.

Concurrency contract: both run on the event loop; the counter is only written there.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..answers._errors import REQUEST_HEADER_FIELDS_TOO_LARGE, UNEXPECTED_ERROR_BODY

__all__ = ["UNEXPECTED_ERROR_BODY", "CatchAll", "HeaderLimits", "UnexpectedErrors", "header_fields_problem"]

_log = structlog.get_logger("purgatory.service")


def header_fields_problem(
    headers: list[tuple[bytes, bytes]], max_header_count: int, max_header_bytes: int
) -> str | None:
    """Why ``headers`` are refused (431), or None when they are within the limits."""
    if len(headers) > max_header_count:
        return f"{len(headers)} header fields, more than the {max_header_count} allowed"
    size = sum(len(name) + len(value) for name, value in headers)
    if size > max_header_bytes:
        return f"{size} bytes of header fields, more than the {max_header_bytes} allowed"
    return None


class HeaderLimits:
    """Refuse (431, JSON) requests with too many or too large header fields (module docstring)."""

    def __init__(self, app: ASGIApp, *, max_header_count: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_count = max_header_count
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = header_fields_problem(scope["headers"], self.max_header_count, self.max_header_bytes)
            if problem is not None:
                body = {"error": "REQUEST_HEADER_FIELDS_TOO_LARGE", "field": "headers", "message": problem}
                await JSONResponse(body, status_code=REQUEST_HEADER_FIELDS_TOO_LARGE)(scope, receive, send)
                return
        await self.app(scope, receive, send)


@dataclass
class UnexpectedErrors:
    """Requests that reached the catch-all: each one is a bug (or a case the tests missed)."""

    count: int = 0


class CatchAll:
    """Answer any exception the routes let through as a JSON 500 (module docstring)."""

    def __init__(self, app: ASGIApp, *, errors: UnexpectedErrors) -> None:
        self.app = app
        self.errors = errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            # The client left (or h11 refused its body and closed): no one to answer, and not a
            # bug — no traceback, not counted (a malformed body must stay a cheap refusal).
            _log.debug("request_client_disconnected", method=scope["method"], path=scope["path"])
        except Exception:
            self.errors.count += 1
            _log.exception("request_failed_unexpectedly", method=scope["method"], path=scope["path"])
            if started:
                raise  # half a response is out: only closing the connection can tell the client
            await JSONResponse(UNEXPECTED_ERROR_BODY, status_code=500)(scope, receive, send)
