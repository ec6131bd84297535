"""The ASGI bridge: an HTTP/2 stream the fast path does not take, served by the ASGI app.

A request that is not a long poll the fast path serves (another route, a body, a refusal) is
handed to the app as an ASGI exchange on its stream: ``receive`` gives its buffered body, then
waits for the client to leave; ``send`` turns the app's messages into the stream's answer, which
the session writes through ``h2`` (:meth:`H2Bridge.bridged_done`). :class:`H2Bridge` is the
session's half that starts and finishes these exchanges (a mixin of :class:`._long_poll.H2Session`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h2.errors
import structlog
from starlette.responses import JSONResponse

from ...answers._errors import UNEXPECTED_ERROR_BODY, RequestError
from ...answers._render import error_response
from ._writer import H2AnswerWriter

__all__ = ["H2Bridge", "_Bridged"]

_log = structlog.get_logger("purgatory.service")

# HTTP/1.1 connection-specific fields HTTP/2 forbids (RFC 9113 §8.2.2): dropped from ASGI answers.
_CONNECTION_FIELDS = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)


class _Bridged:
    """One stream served by the ASGI app: its ``receive`` and ``send``, the answer sent when complete."""

    def __init__(self, session: H2Bridge, stream_id: int, body: bytes) -> None:
        self.session = session
        self.stream_id = stream_id
        self.body: bytes | None = body  # None once handed to the app
        self.left = asyncio.Event()  # the client reset the stream or the connection went away
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.response: bytes | bytearray = b""
        self.complete = False

    async def receive(self) -> dict[str, Any]:
        body, self.body = self.body, None
        if body is not None:
            return {"type": "http.request", "body": body, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.left.is_set() or self.complete:
            return
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = [
                (bytes(name).lower(), bytes(value))
                for name, value in message.get("headers", ())
                if bytes(name).lower() not in _CONNECTION_FIELDS
            ]
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if not self.response and type(body) is bytes:
                # The common answer, one message: the app's bytes themselves. A long poll's body is
                # shared by every stream answered alike (SharedAnswers); a copy per stream was
                # two per stream (here, then bytes() of it): +530 MB for 100 streams of a cold
                # service's 4 MB answers (the back-pressure report's h2c replay).
                self.response = body
            else:
                if not isinstance(self.response, bytearray):
                    self.response = bytearray(self.response)
                self.response += body
            if not message.get("more_body", False):
                self.complete = True
                self.left.set()  # a receive still awaited (a disconnect watcher) returns
                self.session.bridged_done(self)


class H2Bridge(H2AnswerWriter):
    """The session's streams the ASGI app serves: started as tasks, answered once complete."""

    bridged: dict[int, _Bridged]

    def _scope(self, pseudo: dict[bytes, bytes], headers: list[tuple[bytes, bytes]]) -> dict[str, Any] | None:
        raise NotImplementedError  # the session's: the ASGI scope of a stream's request

    def _bridge(
        self, stream_id: int, pseudo: dict[bytes, bytes], headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        scope = self._scope(pseudo, headers)
        if scope is None:
            error = RequestError(400, "INVALID_REQUEST", "path", "the request path is not ASCII")
            self._respond_with(stream_id, error_response(error))
            return
        exchange = _Bridged(self, stream_id, body)
        self.bridged[stream_id] = exchange
        task = self.loop.create_task(self._run_app(exchange, scope))
        tasks = self.protocol.tasks  # uvicorn's graceful shutdown waits for these
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run_app(self, exchange: _Bridged, scope: dict[str, Any]) -> None:
        try:
            await self.protocol.app(scope, exchange.receive, exchange.send)
        except Exception:
            _log.exception("h2_asgi_app_failed", path=scope.get("path"))
            if exchange.status == 0 and not exchange.left.is_set():  # nothing sent yet: a JSON 500
                exchange.status = 500
                exchange.headers = list(JSONResponse(UNEXPECTED_ERROR_BODY, status_code=500).raw_headers)
                exchange.response = bytearray(JSONResponse(UNEXPECTED_ERROR_BODY).body)
                exchange.complete = True
                self.bridged_done(exchange)
        finally:
            if self.bridged.pop(exchange.stream_id, None) is not None and not self.transport.is_closing():
                # The app returned without a complete answer: the stream cannot be answered now.
                self._reset(exchange.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)

    def bridged_done(self, exchange: _Bridged) -> None:
        if self.bridged.pop(exchange.stream_id, None) is exchange:
            self._respond(exchange.stream_id, exchange.status, exchange.headers, bytes(exchange.response))
            self._close_if_done()
