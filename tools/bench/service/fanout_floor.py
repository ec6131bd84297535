"""What holding and answering N long polls costs *without* ASGI: the floor under ``bench fanout``.

``python -m purgatory.tools.bench.service.fanout_floor -n 10000 [--uvloop] [--sockets-only]``

The service answers a long poll through uvicorn and Starlette: a task and a coroutine chain per
waiting request, and per answer a task wake-up, the middleware stack's send wrappers, the HTTP
library's response state machine and two writes. ``bench fanout`` measured ~23 KB per waiter and
~100-130 µs of service CPU per answer for that. This experiment holds the same N connections,
opened and read by the same client (``bench fanout``'s), in a bare :class:`asyncio.Protocol`
server: no task per waiter, and one loop callback writes the same pre-rendered answer to every
waiter (what a protocol-level long-poll path could do). Its figures bound from below what any
design of the service can reach on this machine with this client: bytes per waiter (RSS), server
CPU per answer, and the answer times seen by the client (the client's own reading of N sockets
is part of them). No Kafka: ``/fire`` stands in for the produce.

The server runs in its own process (this module with ``serve``), stopped by its PID.

``--sockets-only`` measures the floor under that floor: the kernel's share alone. N loopback TCP
connections in this process, the same answer ``send`` on each server side in a bare loop, then
every client side read from one ``epoll`` set with ``recv_into``: the CPU per answer of the two
system calls (and the least Python around them) that any server and client with one connection
per waiter pay, whatever their design. N answers cannot arrive sooner than N times that.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Annotated, cast

import typer
from purgatory.adapters.kafka.local import free_port

from ..measure import cpu_seconds, percentile, rss_bytes
from . import fanout
from .h1_client import AnswerReader, open_long_polls

__all__ = ["ANSWER", "main"]

_BODY = json.dumps(
    {
        "topic": "floor", "partition": 0, "outcome": "COMPLETED", "error_code": 0, "fetch_offset": 0,
        "next_offset": 1, "records": [{"offset": 0, "timestamp_ms": 1, "key": None, "value": "fanout"}],
        "error": None,
    },
    separators=(",", ":"),
).encode()  # fmt: skip
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_BODY),
    _BODY,
)
MODULE = "purgatory.tools.bench.service.fanout_floor"  # run as __main__, it does not know its name
START_TIMEOUT_S = 30.0
GC_THRESHOLDS = (50_000, 20, 100)  # as the service's admission.gc_thresholds
MEASURE_TIMEOUT_S = 120.0  # bound on one run's registration and answers


def _install_uvloop() -> None:
    # Not a dependency of the project (uvicorn picks it up when installed): imported by name so
    # the type check passes without it.
    importlib.import_module("uvloop").install()


def _serve(port: int, use_uvloop: bool) -> None:
    """The floor server: every GET is a waiter, except ``/fire`` (answer all) and ``/count``."""
    if use_uvloop:
        _install_uvloop()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    waiters: list[asyncio.Transport] = []

    class LongPoll(asyncio.Protocol):
        __slots__ = ("buffer", "transport")

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            if b"\r\n\r\n" not in self.buffer:
                return
            line, self.buffer = self.buffer.split(b"\r\n", 1)[0], b""
            if line.startswith(b"GET /fire"):
                answered = len(waiters)
                for transport in waiters:  # one callback, the same bytes for every waiter
                    transport.write(ANSWER)
                waiters.clear()
                self._reply(str(answered).encode())
            elif line.startswith(b"GET /count"):
                self._reply(str(len(waiters)).encode())
            else:
                waiters.append(self.transport)

        def _reply(self, body: bytes) -> None:
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(LongPoll, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()

    asyncio.run(run())


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:  # loopback
        return bytes(response.read())


async def _measure(pid: int, port: int, waiters: int) -> str:
    rss0 = rss_bytes(pid)
    polls = await open_long_polls(port, "floor", waiters, 1, fanout.MAX_WAIT_MS)
    reader = AnswerReader(polls, time.monotonic() + MEASURE_TIMEOUT_S)  # the bench's client, as there
    reader.start()
    try:
        while int(await asyncio.to_thread(_get, port, "/count")) < waiters:
            await asyncio.sleep(fanout.HEALTH_POLL_S)
        rss1 = rss_bytes(pid)
        cpu0, client_cpu0, fired_ns = cpu_seconds(pid), time.process_time(), time.monotonic_ns()
        await asyncio.to_thread(_get, port, "/fire")
        await asyncio.to_thread(reader.join)
        cpu_s, client_cpu_s = cpu_seconds(pid) - cpu0, time.process_time() - client_cpu0
    finally:
        reader.stop()
        await asyncio.to_thread(reader.join)
        for poll in polls:
            poll.close()
    lags = sorted((p.answered_ns - fired_ns) / 1e6 for p in polls if p.answered_ns)
    ok = sum(p.status == 200 for p in polls)
    p50, p99 = percentile(lags, 0.5), percentile(lags, 0.99)
    return (
        f"{waiters} waiters: {(rss1 - rss0) / waiters:.0f} B/waiter, answer p50 {p50:.1f} ms "
        f"p99 {p99:.1f} ms, server CPU {1e6 * cpu_s / waiters:.1f} µs/answer, client CPU "
        f"{1e6 * client_cpu_s / waiters:.1f} µs/answer, {ok} answered 200; "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def _sockets_only(waiters: int) -> str:
    """The system calls' floor (module docstring): CPU per answer of ``send`` and of ``epoll`` + ``recv``."""
    fds = fanout._raise_fd_limit(2 * waiters + fanout.FD_HEADROOM)
    pairs = min(waiters, (fds - fanout.FD_HEADROOM) // 2)  # both ends are in this process
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    servers: list[socket.socket] = []
    clients: list[socket.socket] = []
    try:
        for _ in range(pairs):
            clients.append(socket.create_connection(listener.getsockname()))
            servers.append(listener.accept()[0])
        for sock in (*servers, *clients):
            sock.setblocking(False)
        cpu0 = time.process_time()
        for sock in servers:
            sock.send(ANSWER)
        send_s = time.process_time() - cpu0
        buffer = bytearray(64 * 1024)
        by_fd = {sock.fileno(): sock for sock in clients}
        with select.epoll() as epoll:
            for fd in by_fd:
                epoll.register(fd, select.EPOLLIN)
            cpu1, left = time.process_time(), pairs
            while left:
                for fd, _ in epoll.poll(MEASURE_TIMEOUT_S, pairs):
                    by_fd[fd].recv_into(buffer)
                    left -= 1
            recv_s = time.process_time() - cpu1
    finally:
        for sock in (*servers, *clients, listener):
            sock.close()
    send_us, recv_us = 1e6 * send_s / pairs, 1e6 * recv_s / pairs
    return (
        f"{pairs} loopback connections: send {send_us:.1f} µs/answer, epoll + recv {recv_us:.1f} µs/answer "
        f"of CPU; {waiters} answers need >= {waiters * send_us / 1000:.0f} ms of the sender's core and "
        f"{waiters * recv_us / 1000:.0f} ms of the reader's; load average {os.getloadavg()[0]:.2f}"
    )


def main(
    waiters: Annotated[int, typer.Option("--waiters", "-n", help="Idle long polls held.")] = 10_000,
    use_uvloop: Annotated[
        bool, typer.Option("--uvloop", help="uvloop in the server and the client.")
    ] = False,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1)] = 3,
    sockets_only: Annotated[
        bool,
        typer.Option("--sockets-only", help="Only the send/recv system calls' floor (module docstring)."),
    ] = False,
) -> None:
    """Hold ``waiters`` long polls in a bare protocol server, answer them at once, print the costs."""
    if sockets_only:
        for _ in range(repeats):
            typer.echo(_sockets_only(waiters))
        return
    fanout._raise_fd_limit(2 * waiters + fanout.FD_HEADROOM)
    for _ in range(repeats):
        port = free_port()
        server = subprocess.Popen(  # our own interpreter and module
            [sys.executable, "-m", MODULE, "serve", str(port), "uvloop" if use_uvloop else "asyncio"]
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                try:
                    _get(port, "/count")
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("the floor server did not start") from None
                    time.sleep(fanout.HEALTH_POLL_S)
            if use_uvloop:
                _install_uvloop()
            typer.echo(asyncio.run(_measure(server.pid, port, waiters)))
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(fanout.SERVICE_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(fanout.SERVICE_STOP_TIMEOUT_S)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        _serve(int(sys.argv[2]), sys.argv[3] == "uvloop")
    else:
        typer.run(main)
