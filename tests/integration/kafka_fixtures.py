"""Session-wide Kafka fixtures, shared by every test directory (imported by ``tests/conftest.py``).

``kafka_cluster`` — a :class:`KafkaClusterHandle` for one broker, chosen by the provider order of
DESIGN §5 (``PURGATORY_KAFKA_BOOTSTRAP`` → testcontainers when Docker answers → the local
launcher) and started once per session; ``kafka_bootstrap`` — its bootstrap servers;
``kafka_settings`` — :class:`KafkaSettings` pointing at it; ``kafka_topic_factory`` — creates
fresh, uniquely named topics and waits until they have leaders.

Kafka client imports happen inside the fixtures, so test runs that never ask for Kafka do not
need the ``kafka`` extra.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from purgatory.adapters.kafka import KafkaClusterHandle

    from purgatory.settings import KafkaSettings

TopicFactory = Callable[..., str]
TOPIC_CREATE_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaClusterHandle]:
    from purgatory.adapters.kafka import provide_cluster

    handle = provide_cluster()
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_cluster: KafkaClusterHandle) -> str:
    return kafka_cluster.bootstrap_servers


@pytest.fixture(scope="session")
def kafka_settings(kafka_bootstrap: str) -> KafkaSettings:
    from purgatory.settings import KafkaSettings

    return KafkaSettings(bootstrap_servers=kafka_bootstrap)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    replication: int = 1,
    config: Mapping[str, str] | None = None,
    replica_assignment: list[list[int]] | None = None,
) -> str:
    """Create ``name`` and wait (bounded) until every partition has a leader."""
    import time

    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if replica_assignment is not None:
        # librdkafka wants the partition count with an assignment, and no replication factor.
        topic = NewTopic(
            name, len(replica_assignment), replica_assignment=replica_assignment, config=dict(config or {})
        )
    else:
        topic = NewTopic(name, partitions, replication, config=dict(config or {}))
    for future in admin.create_topics([topic], request_timeout=TOPIC_CREATE_TIMEOUT_S).values():
        future.result(timeout=TOPIC_CREATE_TIMEOUT_S)
    deadline = time.monotonic() + TOPIC_CREATE_TIMEOUT_S
    while time.monotonic() < deadline:
        metadata = admin.list_topics(name, timeout=5)
        parts = metadata.topics[name].partitions if name in metadata.topics else {}
        if (
            len(parts) == (len(replica_assignment) if replica_assignment else partitions)
            and all(p.leader >= 0 for p in parts.values())
            and _leaders_answer(admin, name, len(parts))
        ):
            return name
        time.sleep(0.05)  # metadata propagation has no event to wait on from the client side
    raise TimeoutError(f"topic {name} has no leaders after {TOPIC_CREATE_TIMEOUT_S} s")


def _leaders_answer(admin: Any, name: str, partitions: int) -> bool:
    """True once every partition's leader answers ListOffsets (metadata can run ahead of it)."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    request = {TopicPartition(name, p): OffsetSpec.latest() for p in range(partitions)}
    try:
        for future in admin.list_offsets(request, request_timeout=5).values():
            future.result(timeout=10)
    except KafkaException:
        return False
    return True


@pytest.fixture
def kafka_topic_factory(kafka_bootstrap: str) -> TopicFactory:
    def make(partitions: int = 1, *, prefix: str = "t", config: Mapping[str, str] | None = None) -> str:
        return create_topic(kafka_bootstrap, f"{prefix}-{uuid.uuid4().hex[:10]}", partitions, 1, config)

    return make
