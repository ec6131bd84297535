"""Session-wide Kafka fixtures, shared by every test directory (imported by ``tests/conftest.py``).

``kafka_cluster`` — a :class:`KafkaClusterHandle` for one broker, chosen by the provider order of
docs/design.md §5 (``PURGATORY_KAFKA_BOOTSTRAP`` → testcontainers when Docker answers → the local
launcher) and started once per session; ``kafka_bootstrap`` — its bootstrap servers;
``kafka_settings`` — :class:`KafkaSettings` pointing at it; ``kafka_topic_factory`` — creates
fresh, uniquely named topics and waits until they have leaders. ``kafka_cluster3`` — three local
brokers for one test module, with :func:`replicated_topic` / :func:`restore_followers` for the
replication tests (the purgatory's and the HTTP service's).

Kafka client imports happen inside the fixtures, so test runs that never ask for Kafka do not
need the ``kafka`` extra.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from purgatory.adapters.kafka import KafkaClusterHandle, LocalKafkaCluster, TopicPartitionKey

    from purgatory.settings import KafkaSettings

TopicFactory = Callable[..., str]
TOPIC_CREATE_TIMEOUT_S = 30.0
WAIT_S = 20.0  # bound on any single wait for Kafka to act in these tests
ISR_WAIT_S = 60.0  # a restarted follower catches up and rejoins the ISR (replica.lag.time.max.ms 4 s)
LEADER, FOLLOWERS = 1, (2, 3)  # in kafka_cluster3 node 1 is the controller and leads test topics


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``predicate`` (cluster state has no client-side event) until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")


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


@pytest.fixture(scope="module")  # module: its three JVMs stop once that module's tests are done
def kafka_cluster3() -> Iterator[LocalKafkaCluster]:
    """Three local brokers; node 1 is also the controller (faults hit the followers 2 and 3)."""
    from purgatory.adapters.kafka import LocalKafkaCluster

    cluster = LocalKafkaCluster(brokers=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _isr(settings: KafkaSettings, key: TopicPartitionKey) -> tuple[int, ...] | None:
    """The partition's ISR, or None while the cluster does not answer (a broker just resumed)."""
    from purgatory.adapters.kafka import ClusterView, KafkaUnavailableError

    view = ClusterView(settings)
    try:
        return view.facts([key]).partitions[key].isr
    except KafkaUnavailableError:
        return None
    finally:
        view.close()


def wait_isr(settings: KafkaSettings, key: TopicPartitionKey, size: int) -> None:
    wait_until(
        lambda: len(_isr(settings, key) or ()) == size, f"ISR of {key.label} has {size} replicas", ISR_WAIT_S
    )


def replicated_topic(cluster: LocalKafkaCluster, prefix: str) -> tuple[KafkaSettings, TopicPartitionKey]:
    """A fresh RF-3 topic (min.insync.replicas 2) led by node 1, all replicas in sync, and settings
    with a short admin timeout: a request may land on a hung broker while a test runs."""
    from purgatory.adapters.kafka import TopicPartitionKey

    from purgatory.settings import KafkaSettings

    settings = KafkaSettings(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=2000)
    topic = create_topic(
        cluster.bootstrap_servers,
        f"{prefix}-{uuid.uuid4().hex[:8]}",
        replica_assignment=[[LEADER, *FOLLOWERS]],
        config={"min.insync.replicas": "2"},
    )
    key = TopicPartitionKey(topic, 0)
    wait_isr(settings, key, 3)
    return settings, key


def restore_followers(cluster: LocalKafkaCluster, settings: KafkaSettings, key: TopicPartitionKey) -> None:
    """Resume or restart the followers a test froze or stopped, and wait until they are in sync."""
    for node in FOLLOWERS:
        cluster.resume_broker(node)
        if not cluster.node(node).is_running():
            cluster.start_broker(node)
    wait_isr(settings, key, 3)
