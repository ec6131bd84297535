"""The ASGI bridge: an HTTP/2 stream the fast path does not take, served by the ASGI app.

A request that is not a long poll the fast path serves (another route, a body, a refusal) is
handed to the app as an ASGI exchange on its stream: ``receive`` gives its buffered body, then
waits for the client to leave; ``send`` turns the app's messages into the stream's answer, which
the session writes through ``h2`` (:meth:`H2Session.bridged_done`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._long_poll import H2Session

__all__ = ["_Bridged"]

# HTTP/1.1 connection-specific fields HTTP/2 forbids (RFC 9113 §8.2.2): dropped from ASGI answers.
_CONNECTION_FIELDS = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)


class _Bridged:
    """One stream served by the ASGI app: its ``receive`` and ``send``, the answer sent when complete."""

    def __init__(self, session: H2Session, stream_id: int, body: bytes) -> None:
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
