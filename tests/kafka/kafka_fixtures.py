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
    from purgatory.adapters.kafka.settings import KafkaSettings

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
    from purgatory.adapters.kafka.settings import KafkaSettings

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


@pytest.fixture(scope="module")  # module: its JVM stops once that module's tests are done
def kafka_cluster1() -> Iterator[LocalKafkaCluster]:
    """One local broker of the module's own: its tests may stop or kill it (the session's
    broker, ``kafka_cluster``, serves every other test)."""
    from purgatory.adapters.kafka import LocalKafkaCluster

    cluster = LocalKafkaCluster(brokers=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")  # module: its three JVMs stop once that module's tests are done
def kafka_cluster3() -> Iterator[LocalKafkaCluster]:
    """Three local brokers; node 1 is also the only controller (faults hit the followers 2 and 3)."""
    from purgatory.adapters.kafka import LocalKafkaCluster

    # One voter, not the default three: these scenarios stop or freeze both followers at once
    # and need the controller to shrink the ISR meanwhile, or freeze "the controller" (node 1)
    # so that no metadata reaches a resumed node — with three voters nodes 2 and 3 would
    # elect another controller. test_cluster_control.py covers the three-voter default.
    cluster = LocalKafkaCluster(brokers=3, controllers=1)
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
    from purgatory.adapters.kafka.settings import KafkaSettings

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


# -- a record stranded on a leader that then dies (the acks=1 hole of DelayedProduce) --------------

# Replicas [2, 3, 1]: node 2 leads, node 3 is next in line, node 1 (the controller) last — the
# leader can die while the controller lives.
STRANDING_REPLICAS = (2, 3, 1)


def _config_values(admin: Any, resource: Any, names: tuple[str, ...]) -> dict[str, str]:
    """``names`` of one config resource, as DescribeConfigs answers them (bounded)."""
    (future,) = admin.describe_configs([resource], request_timeout=10).values()
    entries = future.result(timeout=15)
    missing = [n for n in names if n not in entries]
    assert not missing, f"{resource} does not report {missing}"
    return {n: entries[n].value for n in names}


class StrandedRecord:
    """Strands records on a partition's leader, then kills it, so a leader change discards them.

    The scenario, each step a precondition this class establishes or fails on, clearly:

    1. Every follower is frozen (SIGSTOP) *before* the append, so none can fetch what follows —
       except through a fetch it sent before freezing: the leader holds that fetch for up to
       ``replica.fetch.wait.max.ms`` and answers it once data arrives (after the produce that
       brought it has been answered: Kafka completes waiting fetches after sending the produce
       response), into the frozen node's socket buffer, read on resume. So the first append is
       a *filler* larger than ``replica.fetch.max.bytes``: a fetch from an offset at or before
       the filler's returns at most the filler (one batch larger than the limit is returned
       whole and alone; a read from further back stops within the limit), never a record
       appended after it. A frozen follower therefore never holds the records after the filler.
    2. The leader holds them (its acks=1 answer) and its high watermark stays at the filler's
       offset (:meth:`assert_stranded`): no follower confirmed even the filler.
    3. The leader is killed, then the followers resume. They stay eligible only if they
       resumed before the controller fenced them (``broker.session.timeout.ms`` since the last
       heartbeat, up to ``broker.heartbeat.interval.ms`` before the freeze) and before the ISR
       could drop them (``replica.lag.time.max.ms``; the frozen controller cannot commit a
       shrink meanwhile anyway): :meth:`kill_leader_and_resume` fails when the freeze lasted
       longer. With ``unclean.leader.election.enable`` false a follower in the ISR is elected,
       and with ``min.insync.replicas`` no more than the survivors, their high watermark moves
       on: the old completion rule then sees it pass the discarded records' offsets.
    """

    def __init__(self, cluster: LocalKafkaCluster, settings: KafkaSettings, key: TopicPartitionKey) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, ConfigResource
        from purgatory.adapters.kafka import ClusterView

        self.cluster, self.settings, self.key = cluster, settings, key
        self.leader, *followers = STRANDING_REPLICAS
        self.followers = tuple(followers)
        leader_address = f"127.0.0.1:{cluster.node(self.leader).spec.broker_port}"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
        broker = _config_values(
            admin,
            ConfigResource(ConfigResource.Type.BROKER, str(self.leader)),
            ("replica.fetch.max.bytes", "replica.lag.time.max.ms"),
        )
        controller = _config_values(
            admin,
            ConfigResource(ConfigResource.Type.BROKER, "1"),  # node 1 is the only controller
            ("broker.session.timeout.ms", "broker.heartbeat.interval.ms"),
        )
        topic = _config_values(
            admin,
            ConfigResource(ConfigResource.Type.TOPIC, key.topic),
            ("unclean.leader.election.enable", "min.insync.replicas", "max.message.bytes"),
        )
        assert topic["unclean.leader.election.enable"] == "false", (
            "the scenario is a clean election of an in-sync follower, not an unclean one"
        )
        assert int(topic["min.insync.replicas"]) <= len(self.followers), (
            f"min.insync.replicas {topic['min.insync.replicas']} > the {len(self.followers)} survivors: "
            "their high watermark would never pass the records, and no completion rule could be wrong"
        )
        self.fetch_max_bytes = int(broker["replica.fetch.max.bytes"])
        self.filler_bytes = self.fetch_max_bytes + 1024  # a batch's overhead is < 100 bytes
        assert self.filler_bytes + 1024 <= int(topic["max.message.bytes"]), (
            f"the topic's max.message.bytes {topic['max.message.bytes']} cannot take the "
            f"{self.filler_bytes}-byte filler"
        )
        self.freeze_budget_s = (
            min(
                int(controller["broker.session.timeout.ms"])
                - int(controller["broker.heartbeat.interval.ms"]),
                int(broker["replica.lag.time.max.ms"]),
            )
            / 1000.0
        )
        # Both clients talk to the leader only (bootstrapped there, connected before the freeze):
        # a request routed to a frozen node would hang instead. The leader runs throughout, so
        # the view waits for it as long as any step here (settings' 2 s is for hung brokers; a
        # loaded machine answered the first ListOffsets later than that). A slow answer inside
        # the freeze counts against the freeze budget, which is checked.
        self.view = ClusterView(
            settings, bootstrap_servers=leader_address, request_timeout_ms=int(WAIT_S * 1000)
        )
        self._producer = Producer(
            {
                "bootstrap.servers": leader_address,
                "acks": "1",
                "linger.ms": 0,
                "message.max.bytes": self.filler_bytes + 4096,
                "compression.type": "none",  # the filler's size on the wire is its size in the log
                "log_level": 0,
            }
        )
        self._producer.list_topics(key.topic, timeout=10)
        self.view.high_watermarks([key])
        self.filler_offset: int | None = None
        self._frozen_at: float | None = None

    def freeze_followers(self) -> None:
        for node in self.followers:
            self.cluster.pause_broker(node)
        self._frozen_at = time.monotonic()

    def append_filler(self) -> int:
        """Append the filler (followers frozen); its offset, as the leader answered."""
        assert self._frozen_at is not None, "freeze the followers first"
        delivered: list[Any] = []
        self._producer.produce(
            self.key.topic,
            b"f" * self.filler_bytes,
            partition=self.key.partition,
            on_delivery=lambda e, m: delivered.append((e, m)),
        )
        self._producer.flush(WAIT_S)
        assert delivered, f"the leader did not answer the filler's append within {WAIT_S} s"
        ((error, message),) = delivered
        assert error is None, f"the filler's append failed: {error}"
        self.filler_offset = int(message.offset())
        return self.filler_offset

    def assert_stranded(self, offset: int | None = None) -> None:
        """No follower confirmed the filler, let alone ``offset`` (the record appended after it,
        which the leader holds: it answered the acks=1 append)."""
        assert self.filler_offset is not None, "append the filler first"
        assert offset is None or offset > self.filler_offset, (
            f"record at {offset} not appended after the filler at {self.filler_offset}"
        )
        high = self.view.high_watermarks([self.key])[self.key]
        assert high <= self.filler_offset, (
            f"followers frozen, yet the leader's high watermark {high} passed the filler at "
            f"{self.filler_offset}: a follower has records it must not"
        )

    def kill_leader_and_resume(self) -> None:
        """SIGKILL the leader, resume the followers; fail if they were frozen too long to stay eligible."""
        assert self._frozen_at is not None
        try:
            self.cluster.kill_broker(self.leader)
        finally:
            for node in self.followers:
                self.cluster.resume_broker(node)
            frozen_s = time.monotonic() - self._frozen_at
        print(f"followers frozen {frozen_s:.2f} s (budget {self.freeze_budget_s:.2f} s)")
        assert frozen_s < self.freeze_budget_s, (
            f"precondition not met: followers frozen for {frozen_s:.2f} s, not under "
            f"{self.freeze_budget_s:.2f} s (session timeout less a heartbeat, or the ISR lag bound): "
            "the controller may have fenced them or the ISR dropped them, so no elected follower "
            "is known to lack the records"
        )

    def close(self) -> None:
        """Every node running and the partition's ISR full again."""
        self._producer.flush(1)
        self.view.close()
        for node in self.followers:
            self.cluster.resume_broker(node)
        if not self.cluster.node(self.leader).is_running():
            self.cluster.start_broker(self.leader)
        wait_isr(self.settings, self.key, len(STRANDING_REPLICAS))


def stranding_topic(cluster: LocalKafkaCluster, prefix: str) -> tuple[KafkaSettings, TopicPartitionKey]:
    """An RF-3 topic for :class:`StrandedRecord` (replicas :data:`STRANDING_REPLICAS`,
    min.insync.replicas 2, room for the filler), all replicas in sync; short admin timeouts."""
    from purgatory.adapters.kafka import TopicPartitionKey
    from purgatory.adapters.kafka.settings import KafkaSettings

    settings = KafkaSettings(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=2000)
    topic = create_topic(
        cluster.bootstrap_servers,
        f"{prefix}-{uuid.uuid4().hex[:8]}",
        replica_assignment=[list(STRANDING_REPLICAS)],
        config={
            "min.insync.replicas": "2",
            "unclean.leader.election.enable": "false",
            "max.message.bytes": str(8 << 20),
        },
    )
    key = TopicPartitionKey(topic, 0)
    wait_isr(settings, key, len(STRANDING_REPLICAS))
    return settings, key


class RecordAppender:
    """A plain idempotent producer for tests that need records in a partition (not under test).

    ``produce(records)`` sends them in order, waits for every delivery report and returns the
    last offset per partition; it raises on any delivery error.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        from confluent_kafka import Producer
        from purgatory.adapters.kafka import client_config

        self._producer = Producer({**client_config(settings), "enable.idempotence": True, "linger.ms": 0})

    def produce(self, records: Any, timeout_s: float = WAIT_S) -> dict[TopicPartitionKey, int]:
        from purgatory.adapters.kafka import TopicPartitionKey

        last: dict[TopicPartitionKey, int] = {}
        errors: list[Any] = []

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(error)
                return
            key = TopicPartitionKey(message.topic(), message.partition())
            last[key] = max(last.get(key, -1), message.offset())

        for r in records:
            kwargs: dict[str, Any] = {"value": r.value, "key": r.key, "on_delivery": delivered}
            if r.partition is not None:
                kwargs["partition"] = r.partition
            self._producer.produce(r.topic, **kwargs)
        remaining = self._producer.flush(timeout_s)
        assert not errors and remaining == 0, f"records not delivered: {errors or remaining}"
        return last

    def close(self) -> None:
        self._producer.flush(WAIT_S)

    @staticmethod
    def read_all(settings: KafkaSettings, key: TopicPartitionKey) -> list[tuple[int, bytes | None]]:
        """Every record of ``key`` up to its high watermark now: (offset, value), in order."""
        from confluent_kafka import Consumer, TopicPartition
        from purgatory.adapters.kafka import ClusterView, client_config

        # Read after the faults: every broker answers, so wait as long as any step (not settings' 2 s,
        # which a loaded machine's first ListOffsets outlasted).
        view = ClusterView(settings, request_timeout_ms=int(WAIT_S * 1000))
        try:
            end = view.high_watermarks([key])[key]
        finally:
            view.close()
        consumer = Consumer(
            {
                **client_config(settings),
                "group.id": f"read-all-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
            }
        )
        out: list[tuple[int, bytes | None]] = []
        try:
            consumer.assign([TopicPartition(key.topic, key.partition, 0)])
            deadline = time.monotonic() + WAIT_S
            while (out[-1][0] + 1 if out else 0) < end:
                assert time.monotonic() < deadline, f"{key.label} read to {len(out)} of {end}"
                for m in consumer.consume(500, timeout=0.5):
                    if m.error() is None:
                        out.append((m.offset(), m.value()))
        finally:
            consumer.close()
        return out
