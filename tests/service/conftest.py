"""The example service on uvicorn, 127.0.0.1, a kernel-chosen port, wired to the session Kafka."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from purgatory.adapters.service import Gateway, create_app
from purgatory.adapters.service._server import BackgroundServer
from starlette.applications import Starlette

from purgatory.settings import KafkaSettings, Settings

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


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll a fact that has no event to await (purgatory counters, cluster state); bounded."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")
        await asyncio.sleep(0.01)
