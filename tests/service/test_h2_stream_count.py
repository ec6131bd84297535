"""H2ServerConnection: the stream limit decided as ``h2`` decides it, without a walk per stream.

No sockets: an ``h2`` client's bytes fed to the server connection, next to a stock ``h2`` server
connection fed the same bytes.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.exceptions
import h2.settings
import pytest
from purgatory.adapters.service.http.h2._connection import STREAM_WALK_SLACK, H2ServerConnection

REQUEST = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"t"), (b":path", b"/r")]


def _server(kind: type[h2.connection.H2Connection], limit: int) -> h2.connection.H2Connection:
    server = kind(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.local_settings = h2.settings.Settings(
        client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limit}
    )
    server.initiate_connection()
    return server


class _Client:
    def __init__(self) -> None:
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100})

    def open(self, count: int) -> tuple[list[int], bytes]:
        ids = []
        for _ in range(count):
            stream_id = self.conn.get_next_available_stream_id()
            self.conn.send_headers(stream_id, REQUEST, end_stream=True)
            ids.append(stream_id)
        return ids, self.conn.data_to_send()


def _accepts(server: h2.connection.H2Connection, data: bytes) -> bool:
    """Whether the stream opened by ``data`` was accepted: h2 refuses one past the limit with a
    connection error, ours with that stream's REFUSED_STREAM (test_h2_hostile_clients)."""
    refused = getattr(server, "refused", 0)
    try:
        server.receive_data(data)
    except h2.exceptions.TooManyStreamsError:
        return False
    return getattr(server, "refused", 0) == refused


@pytest.mark.parametrize("kind", [h2.connection.H2Connection, H2ServerConnection], ids=["h2", "ours"])
def test_the_stream_limit_is_decided_as_h2_decides_it(kind: type[h2.connection.H2Connection]) -> None:
    server, client = _server(kind, 3), _Client()
    ids, data = client.open(3)
    assert _accepts(server, data), "three open streams: at the limit, accepted"
    for stream_id in ids[:2]:  # two answered: closed
        server.send_headers(stream_id, [(b":status", b"204")], end_stream=True)
    _, data = client.open(2)
    assert _accepts(server, data), "two closed: room for two more"
    _, data = client.open(1)
    assert not _accepts(server, data), "a fourth open stream is over the limit"


def test_opening_streams_does_not_walk_them_all_each_time_and_closed_ones_are_still_dropped() -> None:
    server, client = _server(H2ServerConnection, 5_000), _Client()
    walks: list[int] = []
    walk = server._open_streams

    def counted(remainder: int) -> int:
        walks.append(len(server.streams))
        return walk(remainder)

    server._open_streams = counted  # type: ignore[method-assign]
    ids, data = client.open(500)
    assert _accepts(server, data)
    assert sum(walks) < 4 * 500, f"amortised O(1) per stream, not 125,000 steps: walks over {walks}"
    for stream_id in ids:
        server.send_headers(stream_id, [(b":status", b"204")], end_stream=True)
    _, data = client.open(50)
    assert _accepts(server, data)
    held = len(server.streams)
    _, data = client.open(2 * held + STREAM_WALK_SLACK)
    assert _accepts(server, data)
    assert all(not server.streams[s].closed for s in server.streams if s in ids) or len(server.streams) < len(
        ids
    )
    assert not any(s in server.streams for s in ids), "the answered streams were dropped by a walk"
