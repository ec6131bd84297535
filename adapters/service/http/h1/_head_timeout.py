"""HeadTimeoutH11Protocol: uvicorn's h11 protocol with a bound on reading a request head.

uvicorn bounds the *size* of a request head (``h11_max_incomplete_event_size``) and an idle
keep-alive connection (``timeout_keep_alive``), but not the *time* a head takes: every byte that
arrives cancels the keep-alive timer, and a fresh connection has no timer at all. A client that
trickles a header line every few seconds (slowloris) holds its connection — and a slot of the
server — for ever, and the app never sees the request, so its own timeouts (the body read, the
waits) cannot help.

This protocol starts a timer whenever it waits for a request head: when the connection is made,
and when a response completed on a kept-alive connection. The timer is cancelled when h11 has
the whole head (the request moved past ``IDLE``); if it fires first, the client gets a JSON 408
naming ``headers`` (only if it sent part of a head: a connection that sent nothing is simply
closed, as uvicorn's keep-alive timeout does) and the connection is closed — in stages after a
408 (:data:`LINGER_S`), so the answer is not lost to a reset.

Concurrency contract: as uvicorn's protocols, everything runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ._burst import BurstTimeout
from ._coalesced_timers import CoalescedTimeout, coalesced_timers
from ._framing import StrictH11Connection, refusal_response

__all__ = ["LINGER_S", "HeadTimeoutH11Protocol", "head_timeout_protocol"]

# After a 408 the connection is half-closed (FIN after the answer) and what the client still
# sends is read and dropped until it closes, at most this long: closing a socket with unread
# input sends a reset instead of a FIN, and a reset can erase the client's unread input — the
# 408 — before it reads it (RFC 9112 §9.6, "tear-down"; a trickling client always has a line in
# flight). Short: the client was already too slow once.
LINGER_S = 2.0


class HeadTimeoutH11Protocol(H11Protocol):
    """:class:`H11Protocol` answering 408 to a request head not received within ``head_timeout_s``."""

    head_timeout_s: float = 10.0  # set per server by head_timeout_protocol()
    # True on an instance once its 408 went out (class default: no per-connection attribute).
    _lingering = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # h11 refusing ambiguous framing, bare LFs, obs-fold and unknown versions (._h1_framing).
        self.conn = self._strict_connection()
        # Its own timeout, or one shared with the connections of an answer burst (._burst).
        self._head_timer: CoalescedTimeout | BurstTimeout | None = None
        self._head_bytes = 0  # bytes of the head awaited now (0: the client has sent nothing)

    def _strict_connection(self) -> StrictH11Connection:
        size = self.config.h11_max_incomplete_event_size
        if size is None:
            return StrictH11Connection(h11.SERVER)
        return StrictH11Connection(h11.SERVER, max_incomplete_event_size=size)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_bytes = 0
        # Shared with the heads awaited from the same moment (a burst of long-poll answers re-arms
        # thousands at once): one loop timer per bucket, not one per connection.
        self._head_timer = coalesced_timers(self.loop, self.head_timeout_s).call_later(self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # after the 408: read (so closing sends no reset) and dropped
        if self._head_timer is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._disarm_head_timer()  # the whole head arrived (or h11 refused it): not ours now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._awaiting_head():
            self._arm_head_timer()  # kept alive: the next request's head is bounded too

    def _awaiting_head(self) -> bool:
        """The connection is open and waits for the next request's head (not already reading one)."""
        return not self.transport.is_closing() and self.conn.their_state is h11.IDLE

    def send_400_response(self, msg: str) -> None:
        refused = getattr(self.conn, "refused", None)
        if refused is None:
            super().send_400_response(msg)  # h11's own refusal: uvicorn's plain-text 400
            return
        # A head refused by StrictH11Connection: the service's JSON shape, and the connection
        # closed (RFC 9112 §6.1: after ambiguous framing, the bytes that follow mean nothing).
        self.transport.write(refusal_response(refused))
        self.transport.close()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._head_bytes:
            # h11 cannot send a response to a request it has not seen: written directly.
            message = (
                f"the request head was not received within {self.head_timeout_s * 1000:.0f} ms "
                f"({self._head_bytes} bytes arrived)"
            )
            body = json.dumps({"error": "REQUEST_TIMEOUT", "field": "headers", "message": message}).encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body
            )
            self.logger.warning("request head not received within %.1f s: closed", self.head_timeout_s)
            if self.transport.can_write_eof():
                # Lingering close (LINGER_S): the client reads the 408 and a FIN, then closes,
                # and asyncio closes this side on that EOF (eof_received returns None).
                # Pinned by test_a_client_still_sending_after_its_408_gets_no_reset.
                self._lingering = True
                self.transport.write_eof()
                self.loop.call_later(LINGER_S, self.transport.close)
                return
        self.transport.close()


def head_timeout_protocol(head_timeout_s: float) -> type[HeadTimeoutH11Protocol]:
    """The protocol class for uvicorn's ``http`` option, bounding request heads to ``head_timeout_s``."""
    return type(
        "HeadTimeoutH11Protocol", (HeadTimeoutH11Protocol,), {"head_timeout_s": float(head_timeout_s)}
    )
