"""Fixtures of the Kafka integration tests: a purgatory wired to the session cluster.

The clusters and the wait helpers live in ``kafka_fixtures`` (shared with tests/service); they
are re-exported here for the modules that import them from ``.conftest``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from purgatory.adapters.kafka import KafkaPurgatory
from purgatory.adapters.kafka.settings import KafkaSettings

from .kafka_fixtures import WAIT_S, wait_until

__all__ = ["WAIT_S", "wait_until"]


@pytest.fixture
def kp(kafka_settings: KafkaSettings) -> Iterator[KafkaPurgatory]:
    """A purgatory + change feed + clients on the session cluster, closed (drained) after the test."""
    service = KafkaPurgatory.connect(kafka_settings, name="it")
    try:
        yield service
    finally:
        service.close()
