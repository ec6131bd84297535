"""The example service on uvicorn, 127.0.0.1, a kernel-chosen port, wired to the session Kafka."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import Gateway, create_app
from purgatory.adapters.service.app._long_poll_route import LongPollRoute
from purgatory.adapters.service.server._server import BackgroundServer
from starlette.applications import Starlette

from purgatory.settings import Settings

WAIT_S = 20.0  # bound on any wait for Kafka or the service in these tests


@dataclass
class Service:
    url: str
    app: Starlette
    settings: Settings

    @property
    def gateway(self) -> Gateway:
        gateway: Gateway = self.app.state.gateway
        return gateway

    def client(self, timeout_s: float = WAIT_S) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=timeout_s)


@pytest.fixture(scope="module")
def service(kafka_settings: KafkaSettings) -> Iterator[Service]:
    settings = Settings(kafka=kafka_settings)
    app = create_app(settings)
    with BackgroundServer(app) as server:
        yield Service(server.url, app, settings)


@dataclass
class Served:
    """A service of a test's own settings on its own server, read as the fast-path tests read it."""

    server: BackgroundServer
    app: Starlette

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return int(self.server.port)

    @property
    def long_poll(self) -> LongPollRoute | None:
        route: LongPollRoute | None = self.app.state.long_poll
        return route

    @property
    def pending(self) -> int:
        """Long polls waiting (requests: equal ones share one operation of the fetch purgatory)."""
        return int(self.app.state.gateway.long_poll_waiters)

    @property
    def taken(self) -> int:
        """Long polls the protocol-level fast path parked (not a task in the app)."""
        return int(self.app.state.gateway.task_free_fetches)


@contextmanager
def serving(settings: Settings) -> Iterator[Served]:
    """``create_app(settings)`` on a background server (127.0.0.1), stopped gracefully (1 s) after."""
    app = create_app(settings)
    with BackgroundServer(app, graceful_shutdown_s=1) as server:
        yield Served(server, app)


class RecordingTransport:
    """A fake transport for protocol tests without sockets: what was written, whether closed."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0  # a socket that takes every write at once

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        """What was written since the last take."""
        data, self.written = bytes(self.written), bytearray()
        return data


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll a fact that has no event to await (purgatory counters, cluster state); bounded."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")
        await asyncio.sleep(0.01)


def exchange_until_closed(port: int, request: bytes, timeout_s: float) -> bytes:
    """Send ``request`` on a new connection and read until the server closes it (bounded)."""
    deadline = time.monotonic() + timeout_s
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        received = b""
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(
                    f"the connection was not closed within {timeout_s} s: {received!r}"
                ) from None
            if not chunk:
                return received
            received += chunk
