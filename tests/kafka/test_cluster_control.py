"""A local cluster's nodes controlled one by one: three KRaft voters, the node commands of the CLI.

One 3-node cluster started by ``purgatory kafka up --brokers 3`` (the default layout: nodes 1-3
are combined broker+controller voters) serves the module; each test leaves every node running.
Teardown runs ``kafka down`` and then SIGKILLs, by PID, any node the state file still named.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from purgatory.adapters.kafka import KafkaPurgatory, ProducerRecord, TopicPartitionKey
from purgatory.adapters.kafka.local import STATE_FILE, cache_dir, free_ports, voter_ids
from purgatory.adapters.kafka.settings import KafkaSettings

from .kafka_fixtures import WAIT_S, create_topic, wait_isr, wait_until

PURGATORY = [str(Path(sys.executable).with_name("purgatory"))]  # the console script of this venv
CLI_TIMEOUT_S = 150  # `kafka up` of 3 JVMs on 2 busy cores, with room
# broker.session.timeout.ms (3 s) after the controller quorum re-elects (fetch timeout 2 s and an
# election): node 1's partitions move on within ~10 s here; the bound leaves room for a slow CI.
LEADER_CHANGE_S = 45.0


def test_one_clusters_ports_are_distinct() -> None:
    # free_port() twice can hand the same port out again (CI once formatted a node whose broker
    # and controller listeners shared one port, and Kafka refused it).
    for _ in range(20):
        ports = free_ports(6)
        assert len(set(ports)) == 6, ports


def test_voters_by_cluster_size() -> None:
    assert voter_ids(1) == (1,), "one node: it is the only voter"
    assert voter_ids(2) == (1,), "two voters would need both alive: one survives losing node 2"
    assert voter_ids(3) == (1, 2, 3), "three nodes: three voters, any one may die"
    assert voter_ids(9) == (1, 2, 3), "more nodes: still three voters, the rest brokers only"
    assert voter_ids(3, controllers=1) == (1,), "a single controller when asked for"
    for brokers, controllers in ((3, 0), (3, 4), (1, 2)):
        with pytest.raises(ValueError, match="controllers"):
            voter_ids(brokers, controllers)


@dataclass(frozen=True)
class CliCluster:
    name: str
    work_dir: Path

    def cli(self, *args: str, name: str | None = None) -> subprocess.CompletedProcess[str]:
        return _cli("kafka", *args, "--name", name or self.name)

    def node_states(self) -> dict[int, str]:
        """Each node's state as ``kafka status`` prints it (``node N (...) ... <state>``)."""
        status = self.cli("status")
        return {
            int(line.split()[1]): line.split()[-1]
            for line in status.stdout.splitlines()
            if line.startswith("node ")
        }

    def bootstrap(self) -> str:
        return str(json.loads((self.work_dir / STATE_FILE).read_text())["bootstrap_servers"])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PURGATORY, *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


def _state_pids(work_dir: Path) -> list[int]:
    try:
        nodes = json.loads((work_dir / STATE_FILE).read_text())["nodes"]
    except FileNotFoundError:
        return []
    return [n["pid"] for n in nodes if n["pid"] is not None]


@pytest.fixture(scope="module")
def cli_cluster() -> Iterator[CliCluster]:
    name = f"ctl-{uuid.uuid4().hex[:6]}"
    cluster = CliCluster(name, cache_dir() / "clusters" / name)
    up = _cli("kafka", "up", "--brokers", "3", "--name", name)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield cluster
    finally:
        pids = _state_pids(cluster.work_dir)  # read before `down` removes the state file
        down = cluster.cli("down")
        for pid in pids:  # `down` failed or timed out part-way: no JVM outlives the module
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert down.returncode == 0, down.stdout + down.stderr


def _partition_leader(admin: AdminClient, topic: str) -> int:
    try:
        metadata = admin.list_topics(topic, timeout=2)
    except Exception:  # KafkaException while the cluster re-elects: no answer yet
        return -1
    partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
    return partitions[0].leader if 0 in partitions else -1


def _deliver(producer: Producer, topic: str, value: bytes) -> None:
    """Produce one record and wait (bounded) for its delivery report; fail on an error."""
    reports: list[tuple[Any, Any]] = []
    producer.produce(topic, value, partition=0, on_delivery=lambda e, m: reports.append((e, m)))
    assert producer.flush(WAIT_S) == 0, f"{value!r} not delivered within {WAIT_S} s"
    ((error, _),) = reports
    assert error is None, f"{value!r} failed: {error}"


@pytest.mark.kafka
def test_killing_node_1_moves_its_partition_to_a_new_leader_and_producers_still_deliver(
    cli_cluster: CliCluster,
) -> None:
    """Node 1 leads the partition (and is one of three controller voters): SIGKILL it. The other
    two voters keep a quorum, so the controller fences node 1 and elects a new leader; a plain
    acks=all producer and the library's produce both deliver. Before, node 1 was the only
    voter: no leader change happened after it died, and both hung."""
    config = (cli_cluster.work_dir / "node-1" / "server.properties").read_text()
    (voters,) = [line for line in config.splitlines() if line.startswith("controller.quorum.voters=")]
    assert voters.count("@") == 3, f"`kafka up --brokers 3` has three controller voters: {voters}"
    bootstrap = cli_cluster.bootstrap()
    topic = create_topic(
        bootstrap,
        f"kill1-{uuid.uuid4().hex[:8]}",
        replica_assignment=[[1, 2, 3]],
        config={"min.insync.replicas": "2"},
    )
    key = TopicPartitionKey(topic, 0)
    settings = KafkaSettings(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    wait_isr(settings, key, 3)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    assert _partition_leader(admin, topic) == 1, "replica order [1, 2, 3]: node 1 leads"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    _deliver(producer, topic, b"before")  # warm: the producer knows node 1 leads
    try:
        killed = cli_cluster.cli("kill-node", "1")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert cli_cluster.node_states()[1] == "stopped", "kill-node 1 left no JVM"
        wait_until(
            lambda: _partition_leader(admin, topic) in (2, 3),
            "a surviving node leads the partition node 1 led",
            LEADER_CHANGE_S,
        )
        _deliver(producer, topic, b"after")  # acks=all: ISR {2, 3} >= min.insync.replicas 2
        with KafkaPurgatory.connect(settings, bootstrap_servers=bootstrap, name="kill-node-1") as kp:
            op = kp.produce([ProducerRecord(topic, b"library", partition=0)], delay_ms=15_000)
            assert op.wait(WAIT_S) and op.succeeded, op.statuses
    finally:
        producer.flush(1)
        started = cli_cluster.cli("start-node", "1")
    assert started.returncode == 0, started.stdout + started.stderr
    assert cli_cluster.node_states() == {1: "running", 2: "running", 3: "running"}
    wait_isr(settings, key, 3)


@pytest.mark.kafka
def test_node_commands_stop_start_kill_pause_and_resume_one_node(cli_cluster: CliCluster) -> None:
    steps = [
        ("stop-node", 2, {2: "stopped"}),
        ("start-node", 2, {2: "running"}),
        ("kill-node", 3, {3: "stopped"}),
        ("start-node", 3, {3: "running"}),
        ("pause-node", 2, {2: "paused"}),
        ("resume-node", 2, {2: "running"}),
    ]
    try:
        for command, node, expected in steps:
            done = cli_cluster.cli(command, str(node))
            assert done.returncode == 0, f"{command} {node}: {done.stdout}{done.stderr}"
            states = cli_cluster.node_states()
            assert {n: states[n] for n in expected} == expected, f"after {command} {node}: {states}"
        assert cli_cluster.node_states() == {1: "running", 2: "running", 3: "running"}
    finally:
        # A failed step must not leave the module's cluster frozen or short of a node.
        cli_cluster.cli("resume-node", "2")
        for node, state in cli_cluster.node_states().items():
            if state == "stopped":
                cli_cluster.cli("start-node", str(node))


@pytest.mark.kafka
def test_node_commands_name_an_unknown_node_or_a_missing_cluster(cli_cluster: CliCluster) -> None:
    unknown = cli_cluster.cli("kill-node", "7")
    assert unknown.returncode == 2 and "no node 7" in unknown.stderr, unknown.stderr
    assert "nodes 1, 2, 3" in unknown.stderr, "the message lists the nodes there are"
    missing = cli_cluster.cli("stop-node", "1", name=f"none-{uuid.uuid4().hex[:6]}")
    assert missing.returncode == 1 and "no local Kafka cluster named" in missing.stderr, missing.stderr
    stopped = cli_cluster.cli("stop-node", "3")
    try:
        assert stopped.returncode == 0, stopped.stderr
        frozen = cli_cluster.cli("pause-node", "3")
        assert frozen.returncode == 1 and "not running" in frozen.stderr, frozen.stderr
    finally:
        restarted = cli_cluster.cli("start-node", "3")
    assert restarted.returncode == 0, restarted.stderr
    assert cli_cluster.node_states()[3] == "running"
