"""FanoutWrites: a burst's writes shared among threads arrive whole and in order on every socket,
and what a socket does not take (a full buffer, a client gone) ends as ``transport.write`` ends it.

Real loopback TCP connections served by an asyncio server on 127.0.0.1; the writes are made
from a loop callback, as the answer burst makes them. Every test runs with each share sender:
the C one (the GIL released for a whole share) and the Python one (where no compiler was).
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from purgatory.adapters.service.http import _fanout_writes as fanout
from purgatory.adapters.service.http._fanout_writes import MIN_SHARED_WRITES, FanoutWrites

Sender = Callable[[list[tuple[int, bytes]]], list[int]]


@pytest.fixture(autouse=True, params=["c", "python"])
def sender(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Sender:
    """Each share sender in turn, as the one FanoutWrites uses: every test of this module runs
    once per sender."""
    chosen = fanout.NATIVE_SEND_SHARE if request.param == "c" else fanout._send_share
    if chosen is None:  # CI checks it is built (.ci/run); a compiler-less install has only Python's
        pytest.skip("the C share sender is not built")
    monkeypatch.setattr(fanout, "send_share", chosen)
    return chosen


def test_a_share_reports_per_socket_what_it_took_would_block_or_failed(sender: Sender) -> None:
    """The contract both senders keep: the bytes a socket took (all, or what fit in its buffer),
    0 when it takes nothing without blocking, -1 for an error (here a closed peer, EPIPE)."""
    pairs = [socket.socketpair() for _ in range(4)]
    try:
        for ours, _ in pairs:
            ours.setblocking(False)
        fits, full, blocked, gone = pairs
        big = b"z" * (8 * 1024 * 1024)  # past any socket buffer
        while True:  # fill ``blocked`` so that it takes nothing
            try:
                blocked[0].send(big)
            except BlockingIOError:
                break
        gone[1].close()
        result = sender(
            [
                (fits[0].fileno(), b"hello"),
                (full[0].fileno(), big),
                (blocked[0].fileno(), b"x"),
                (gone[0].fileno(), b"y"),
            ]
        )
        assert result[0] == 5 and fits[1].recv(16) == b"hello"
        assert 0 < result[1] < len(big), "a full buffer takes a part"
        assert result[2:] == [0, -1]
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_an_empty_share_sends_nothing(sender: Sender) -> None:
    assert sender([]) == []


class _Sink(asyncio.Protocol):
    """A server side whose transport the test writes to; it records its connection's end."""

    def __init__(self, made: asyncio.Queue[_Sink]) -> None:
        self._made = made
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._made.put_nowait(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()


@asynccontextmanager
async def _connections(n: int) -> AsyncIterator[list[tuple[_Sink, socket.socket]]]:
    """``n`` loopback connections: (server side, client socket), the client sockets blocking."""
    made: asyncio.Queue[_Sink] = asyncio.Queue()
    server = await asyncio.get_running_loop().create_server(lambda: _Sink(made), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pairs: list[tuple[_Sink, socket.socket]] = []
    try:
        for _ in range(n):
            client = socket.create_connection(("127.0.0.1", port))
            pairs.append((await asyncio.wait_for(made.get(), 10), client))
        yield pairs
    finally:
        for sink, client in pairs:
            client.close()
            assert sink.transport is not None
            sink.transport.abort()
        server.close()
        await server.wait_closed()


def _transports(pairs: list[tuple[_Sink, socket.socket]]) -> list[asyncio.Transport]:
    transports = [sink.transport for sink, _ in pairs]
    assert all(t is not None for t in transports)
    return transports  # type: ignore[return-value]


async def _write_all_but_the_first_is_lost(pairs: list[tuple[_Sink, socket.socket]], data: bytes) -> None:
    """``data`` to every connection in shared writes: the first one's connection is closed, every
    other one stays open and receives ``data``."""
    writes = FanoutWrites(threads=2)
    try:
        writes.write([(transport, data) for transport in _transports(pairs)])
        await asyncio.wait_for(pairs[0][0].lost.wait(), 10)
        for sink, client in pairs[1:]:
            assert not sink.lost.is_set()
            assert await asyncio.to_thread(_read_exactly, client, len(data)) == data
    finally:
        writes.close()


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(10)
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        assert chunk, f"the connection ended after {len(chunks)} of {n} bytes"
        chunks += chunk
    return bytes(chunks)


@pytest.mark.parametrize("chunk", [fanout.CHUNK_WRITES, MIN_SHARED_WRITES], ids=["one chunk", "chunks"])
def test_shared_writes_reach_every_socket_whole(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "CHUNK_WRITES", chunk)

    async def scenario() -> None:
        n = 4 * MIN_SHARED_WRITES
        async with _connections(n) as pairs:
            writes = FanoutWrites(threads=3)
            try:
                answers = [b"answer %d " % i * 20 for i in range(n)]
                writes.write(list(zip(_transports(pairs), answers, strict=True)))
                assert writes.direct == n, "not written by descriptor"
                assert writes.shared == -(-n // chunk), "not shared among threads, a share per chunk"
                for (_, client), answer in zip(pairs, answers, strict=True):
                    assert await asyncio.to_thread(_read_exactly, client, len(answer)) == answer
            finally:
                writes.close()

    asyncio.run(scenario())


def test_what_a_full_socket_does_not_take_is_buffered_by_the_transport_in_order() -> None:
    """A client that reads nothing yet: the socket takes part of a large write, the transport the
    rest, and once the client reads it gets every byte in order — then a later write after them."""

    async def scenario() -> None:
        async with _connections(MIN_SHARED_WRITES) as pairs:
            big = bytes(range(256)) * (16 * 1024)  # 4 MiB
            # Fixed, small buffers on both ends (autotuned, loopback can hold 4 MiB and more).
            for sink, client in pairs:
                assert sink.transport is not None
                sink.transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16
                )
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            writes = FanoutWrites(threads=2)
            try:
                writes.write([(transport, big) for transport in _transports(pairs)])
                sink, client = pairs[0]
                assert sink.transport is not None
                assert sink.transport.get_write_buffer_size() > 0, "the socket took it all: nothing tested"
                # Bytes already buffered: the next write must go behind them, through the transport.
                writes.write([(sink.transport, b"after")])
                received = await asyncio.to_thread(_read_exactly, client, len(big) + 5)
                assert received[: len(big)] == big and received[len(big) :] == b"after"
            finally:
                writes.close()

    asyncio.run(scenario())


def test_a_client_gone_before_the_write_closes_its_connection_and_not_the_others() -> None:
    async def scenario() -> None:
        async with _connections(MIN_SHARED_WRITES) as pairs:
            gone_sink, gone_client = pairs[0]
            assert gone_sink.transport is not None
            # The loop must not see the reset by reading: the write is what meets it.
            gone_sink.transport.pause_reading()
            server_fd = gone_sink.transport.get_extra_info("socket").fileno()
            # An abortive close (RST): the server side's next write fails (ECONNRESET or EPIPE).
            gone_client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            gone_client.close()
            readable, _, _ = await asyncio.to_thread(select.select, [server_fd], [], [], 10)
            assert readable, "the reset did not arrive"
            await _write_all_but_the_first_is_lost(pairs, b"x")

    asyncio.run(scenario())


def test_a_transport_refusing_the_write_is_closed_alone_and_every_share_still_goes() -> None:
    """A write the transport refuses (after ``write_eof()``): reported, that connection aborted,
    and the writes around it — shared among threads — still made."""

    async def scenario() -> None:
        errors: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        async with _connections(2 * MIN_SHARED_WRITES) as pairs:
            broken_sink, _ = pairs[0]
            assert broken_sink.transport is not None
            broken_sink.transport.write_eof()  # its next write raises RuntimeError
            await _write_all_but_the_first_is_lost(pairs, b"y")
            assert [e["message"] for e in errors] == ["fan-out write failed"]

    asyncio.run(scenario())


@pytest.mark.parametrize("threads", [2, 1], ids=["closer thread", "no helpers"])
def test_a_lost_connections_socket_is_closed_after_its_last_bytes_and_only_once(threads: int) -> None:
    """``close_later`` from ``connection_lost``: the peer still gets every byte, then the end of
    the stream — with helpers the closer thread closes the socket, without, the transport."""

    async def scenario() -> None:
        writes = FanoutWrites(threads=threads)
        lost = asyncio.Event()

        class Closing(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                self.transport = transport
                transport.write(b"last words")
                transport.close()

            def connection_lost(self, exc: Exception | None) -> None:
                writes.close_later(self.transport)
                lost.set()

        server = await asyncio.get_running_loop().create_server(Closing, "127.0.0.1", 0)
        client = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
        try:
            await asyncio.wait_for(lost.wait(), 10)
            assert await asyncio.to_thread(_read_to_the_end, client) == b"last words"
            assert writes.closed_later == (1 if threads > 1 else 0)
        finally:
            client.close()
            writes.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_a_transport_not_being_closed_keeps_its_socket() -> None:
    """``close_later`` for a transport asyncio is not closing (its reader still registered) does
    nothing: the connection stays usable."""

    async def scenario() -> None:
        async with _connections(1) as pairs:
            (sink, client), writes = pairs[0], FanoutWrites(threads=2)
            try:
                assert sink.transport is not None
                writes.close_later(sink.transport)
                assert writes.closed_later == 0
                writes.write([(sink.transport, b"still here")])
                assert await asyncio.to_thread(_read_exactly, client, 10) == b"still here"
            finally:
                writes.close()

    asyncio.run(scenario())


def _read_to_the_end(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    chunks = bytearray()
    while chunk := sock.recv(4096):
        chunks += chunk
    return bytes(chunks)
