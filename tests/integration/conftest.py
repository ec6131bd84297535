"""Fixtures of the Kafka integration tests: a purgatory wired to the session cluster, a 3-broker cluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from purgatory.adapters.kafka import KafkaPurgatory, LocalKafkaCluster

from purgatory.settings import KafkaSettings

WAIT_S = 20.0  # bound on any single wait for Kafka to act in these tests


@pytest.fixture
def kp(kafka_settings: KafkaSettings) -> Iterator[KafkaPurgatory]:
    """A purgatory + change feed + clients on the session cluster, closed (drained) after the test."""
    service = KafkaPurgatory.connect(kafka_settings, name="it")
    try:
        yield service
    finally:
        service.close()


@pytest.fixture(scope="module")  # module: its three JVMs stop once the replication tests are done
def kafka_cluster3() -> Iterator[LocalKafkaCluster]:
    """Three local brokers (node 1 is also the controller); only the replication tests use it."""
    cluster = LocalKafkaCluster(brokers=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``predicate`` (cluster state has no client-side event) until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")
