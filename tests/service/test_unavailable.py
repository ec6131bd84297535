"""With Kafka unreachable the service still answers, promptly: 503 KAFKA_UNAVAILABLE, never a hang."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.server._server import BackgroundServer

from purgatory.settings import Settings

REQUEST_TIMEOUT_MS = 500  # the cluster view gives up on an admin request after this long


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    kafka = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{_closed_port()}", request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    with BackgroundServer(create_app(Settings(kafka=kafka))) as server:
        yield server.url


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/topics/orders/partitions/0/records?max_wait_ms=100", None),
        ("POST", "/topics/orders/records", {"records": [{"value": "a"}]}),
    ],
)
def test_requests_get_503_kafka_unavailable_within_the_request_timeout(
    url: str, method: str, path: str, body: object
) -> None:
    started = time.monotonic()
    response = httpx.request(method, url + path, json=body, timeout=30.0)
    elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "KAFKA_UNAVAILABLE"
    assert elapsed < 10 * REQUEST_TIMEOUT_MS / 1000, f"answered after {elapsed:.1f} s"


def test_healthz_still_answers_while_kafka_is_unreachable(url: str) -> None:
    response = httpx.get(url + "/healthz", timeout=10.0)
    assert response.status_code == 200, "the service itself is up; Kafka's state is reported"
    assert response.json()["status"] == "ok"
