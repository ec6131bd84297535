"""H2PriorKnowledge: HTTP/2 with prior knowledge (h2c) sniffed on the service's HTTP/1.1 port.

A connection opening with the HTTP/2 preface is served by an :class:`H2Session`; any other stays
with the HTTP/1.1 protocol it was accepted by, untouched. ``http2_capable`` makes a uvicorn
protocol class do that, with the app's endpoint (:mod:`.._endpoint`) handed over by the server.
"""

from __future__ import annotations

from typing import Any

import h11

from .._endpoint import LongPollEndpoint
from ._long_poll import H2_PREFACE, H2Session

__all__ = ["H2PriorKnowledge", "http2_capable"]


class H2PriorKnowledge:
    """Mixin for the service's uvicorn protocols: a connection opening with the HTTP/2 preface
    is served by an :class:`H2Session`; any other stays HTTP/1.1, untouched (module docstring).

    Set on the instance only for HTTP/2 connections (class defaults otherwise): an HTTP/1.1
    connection carries no attribute more (see ``LongPollH11Protocol`` on instance dictionaries).
    """

    _h2: H2Session | None = None
    serves_fast_paths = True  # the app's lifespan warns when its server runs without them
    _preface: bytes = b""  # the start of a preface split across reads

    def data_received(self, data: bytes) -> None:
        session = self._h2
        if session is not None:
            session.data_received(data)
            return
        if self._preface or (data[:1] == b"P" and self._before_first_request()):
            data = self._preface + data
            if len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
                self._preface = data  # wait for the rest of it
                return
            if self._preface:
                self._preface = b""
            if data.startswith(H2_PREFACE):
                self._start_h2(data)
                return
        super().data_received(data)  # type: ignore[misc]

    def _before_first_request(self) -> bool:
        """Nothing arrived on this connection yet: prior knowledge means the preface comes first."""
        conn = getattr(self, "conn", None)
        return (
            conn is not None
            and getattr(self, "cycle", None) is None
            and conn.their_state is h11.IDLE
            and conn.our_state is h11.IDLE
            and not conn.trailing_data[0]
            and not getattr(self, "_head_bytes", 0)
        )

    def _start_h2(self, data: bytes) -> None:
        disarm = getattr(self, "_disarm_head_timer", None)
        if disarm is not None:
            disarm()  # h2 has no request head to trickle: the head timer is HTTP/1.1's
        keep_alive = getattr(self, "timeout_keep_alive_task", None)
        if keep_alive is not None:
            keep_alive.cancel()
        self._h2 = H2Session(self)
        self._h2.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._h2 is not None:
            self._h2.connection_lost()
            # The session and this protocol refer to each other: without this edge a closed
            # connection waited for a full collection (H2Session._free_buffers). Nothing calls
            # data_received, resume_writing or shutdown on a protocol whose connection is lost.
            self._h2 = None
        super().connection_lost(exc)  # type: ignore[misc]

    def shutdown(self) -> None:
        if self._h2 is not None:
            self._h2.shutdown()
            return
        super().shutdown()  # type: ignore[misc]

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._h2 is not None:
            self._h2.writing_resumed()


def http2_capable(protocol: type[Any], endpoint: LongPollEndpoint | None = None) -> type[Any]:
    """``protocol`` (a uvicorn h11 protocol class) accepting HTTP/2 with prior knowledge too,
    serving ``endpoint`` (the app's; None: the one ``protocol`` has, if any)."""
    attributes = {} if endpoint is None else {"endpoint": endpoint}
    return type(protocol.__name__, (H2PriorKnowledge, protocol), attributes)
