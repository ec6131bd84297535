"""A local Apache Kafka cluster (KRaft) started from jars resolved with Maven — no Docker.

Algorithm:

1. **Resolve** (``_maven.py``). ``mvn dependency:copy-dependencies`` runs once per Kafka version
   on the pom shipped in ``local/pom.xml`` and copies the broker's runtime classpath into
   ``<cache>/kafka-<version>/libs`` (``cache`` is ``$PURGATORY_KAFKA_CACHE`` or
   ``~/.cache/kafka-purgatory``). A marker file written last makes a half-finished copy retry.
2. **Lay out.** The KRaft controller voters are combined broker+controller nodes (a static
   quorum: every node's ``controller.quorum.voters`` names them); the other nodes are brokers
   only. :func:`voter_ids`: three voters (nodes 1-3) from three brokers up, so any one node —
   node 1 included — may crash and the other two still elect a controller and move leaders;
   one voter (node 1) below that. With 3 nodes, 2 of them down lose the quorum: no leader
   or ISR change until one returns (a test freezing two nodes that needs a live controller
   asks for ``controllers=1``). Every node listens on free ``127.0.0.1`` ports and gets its
   own ``server.properties``, ``log4j2.properties``, data directory and logs under the
   cluster's work directory.
3. **Format** every node's storage (``kafka.tools.StorageTool format``) in parallel JVMs.
4. **Start** one JVM per node (small heap, serial GC; C1-only JIT unless ``jvm_options`` say
   otherwise), each in its own session so a Ctrl-C to
   the caller does not tear it down half-way; stdout/stderr go to ``<node>/stdout.log``.
5. **Wait** (bounded) until the cluster serves metadata naming all n brokers. On failure every
   node is stopped and :class:`KafkaStartError` carries the tail of the nodes' logs.
6. **Stop** by PID: SIGTERM (Kafka's controlled shutdown) to every node first, then wait;
   SIGKILL after a bound. One node alone: ``stop_broker``; ``kill_broker`` (SIGKILL),
   ``pause_broker`` / ``resume_broker`` (SIGSTOP / SIGCONT) inject faults.

A state file (``state.json`` in the work directory) records PIDs and ports so that
``purgatory kafka down`` in another process can stop a cluster started by ``up``.

Concurrency contract: a :class:`LocalKafkaCluster` is driven by one thread at a time (tests,
the CLI). The JVMs it starts are separate processes; nothing here shares state across threads.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Self

import structlog

from ..clients._errors import (
    KafkaLauncherError,
    KafkaStartError,
    NodeNotRunningError,
    NoLocalClusterError,
    UnknownNodeError,
)
from ._maven import DEFAULT_KAFKA_VERSION, VERSION_ENV, cache_dir, resolve_kafka
from ._node import (
    DEFAULT_HEAP_MB,
    FAST_START_JVM_OPTIONS,
    FORMAT_TIMEOUT_S,
    METADATA_POLL_S,
    READY_PROBE_TIMEOUT_S,
    READY_PROBE_TOPIC,
    START_TIMEOUT_S,
    STEADY_STATE_JVM_OPTIONS,
    STOP_TIMEOUT_S,
    KafkaNode,
    NodeSpec,
    NodeState,
    checked_jvm_options,
    free_port,
    free_ports,
    kafka_uuid,
    voter_ids,
)

__all__ = [
    "DEFAULT_HEAP_MB",
    "FAST_START_JVM_OPTIONS",
    "STATE_FILE",
    "STEADY_STATE_JVM_OPTIONS",
    "KafkaNode",
    "LocalKafkaCluster",
    "NodeSpec",
    "NodeState",
    "free_port",
    "free_ports",
    "voter_ids",
]

_log = structlog.get_logger("purgatory.kafka.local")


class LocalKafkaCluster:
    """1..n Apache Kafka nodes on loopback ports; see the module docstring for the algorithm.

    ``with LocalKafkaCluster(brokers=3) as cluster: cluster.bootstrap_servers`` — or ``start()``
    / ``stop()``. Fault injection by node id: ``stop_broker``, ``start_broker``, ``kill_broker``,
    ``pause_broker``, ``resume_broker`` (each recorded in the state file, so another process's
    ``from_state`` handle and ``purgatory kafka status`` see it). ``controllers``: how many
    nodes are KRaft controller voters (:func:`voter_ids`: 3 from 3 brokers up, so any single
    node may be killed; ``controllers=1`` makes node 1 the only one, for scenarios that must
    freeze every controller while other nodes run).
    ``jvm_options`` (JIT/GC flags of every node): ``FAST_START_JVM_OPTIONS`` by default, pass
    ``STEADY_STATE_JVM_OPTIONS`` to measure steady-state broker CPU (benchmarks).

    Unless ``detach=True`` (``purgatory kafka up``), the JVMs are stopped at interpreter exit
    and, on Linux, killed by the kernel if the starting process dies outright (SIGKILL): call
    ``start()`` and ``start_broker()`` from a thread that lives as long as the cluster (the
    kernel ties the JVM to the thread that started it).
    """

    def __init__(
        self,
        brokers: int = 1,
        *,
        version: str | None = None,
        work_dir: str | Path | None = None,
        heap_mb: int = DEFAULT_HEAP_MB,
        broker_config: Mapping[str, str] | None = None,
        keep_work_dir: bool = False,
        detach: bool = False,
        jvm_options: Sequence[str] = FAST_START_JVM_OPTIONS,
        controllers: int | None = None,
    ) -> None:
        if isinstance(brokers, bool) or not isinstance(brokers, int) or brokers < 1:
            raise ValueError(f"brokers must be an int >= 1, got {brokers!r}")
        self.voters = voter_ids(brokers, controllers)
        self.jvm_options = checked_jvm_options(jvm_options)
        self.brokers = brokers
        self.version = version or os.environ.get(VERSION_ENV) or DEFAULT_KAFKA_VERSION
        self._work_dir_given = work_dir is not None
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self.heap_mb = heap_mb
        self.broker_config = dict(broker_config or {})
        self.keep_work_dir = keep_work_dir
        # detach: the JVMs outlive this Python process (``purgatory kafka up``); otherwise they
        # are stopped at interpreter exit too, so a crashed test run leaves no broker behind.
        self.detach = detach
        self.cluster_id = kafka_uuid()
        self.nodes: dict[int, KafkaNode] = {}

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.spec.broker_port}" for n in self.nodes.values())

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        """Resolve, format and start every node; return once metadata names all brokers."""
        libs = resolve_kafka(self.version)
        classpath = str(libs / "*")
        if self.work_dir is None:
            base = cache_dir() / "clusters"
            base.mkdir(parents=True, exist_ok=True)
            self.work_dir = Path(tempfile.mkdtemp(prefix=f"kafka-{self.brokers}b-", dir=base))
        ports = iter(free_ports(self.brokers + len(self.voters)))  # distinct within the cluster
        specs = [
            NodeSpec(i, next(ports), next(ports) if i in self.voters else None)
            for i in range(1, self.brokers + 1)
        ]
        voters = [spec for spec in specs if spec.controller_port is not None]
        for spec in specs:
            node_dir = self.work_dir / f"node-{spec.node_id}"
            node_dir.mkdir(parents=True, exist_ok=True)
            node = KafkaNode(
                spec, node_dir, classpath, self.heap_mb, self.jvm_options, die_with_parent=not self.detach
            )
            node.write_config(voters, self.brokers, self.broker_config)
            self.nodes[spec.node_id] = node
        self._format()
        if not self.detach:
            atexit.register(self.stop)
        try:
            for node in self.nodes.values():
                node.start()
            self.save_state()
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        _log.info("kafka_cluster_ready", brokers=self.brokers, bootstrap=self.bootstrap_servers)
        return self

    def _format(self) -> None:
        procs = [
            (node, subprocess.Popen(node.format_command(self.cluster_id), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            for node in self.nodes.values()
        ]  # fmt: skip
        failures = []
        for node, proc in procs:
            try:
                out, _ = proc.communicate(timeout=FORMAT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            if proc.returncode != 0:
                failures.append(f"node {node.node_id}: {out.decode(errors='replace')[-2000:]}")
        if failures:
            raise KafkaLauncherError("formatting Kafka storage failed:\n" + "\n".join(failures))

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S, brokers: int | None = None) -> None:
        """Wait (bounded) until metadata lists ``brokers`` live brokers (default: all running),
        names the active controller, and the controller answers an admin call."""
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        expected = brokers if brokers is not None else sum(1 for n in self.nodes.values() if n.is_running())
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        deadline = time.monotonic() + timeout_s
        seen = -1
        while time.monotonic() < deadline:
            # Only nodes this handle started: one killed on purpose elsewhere (a fault test, the
            # CLI) is not a failed start of the node being brought back.
            dead = [n for n in self.nodes.values() if n.started_here and not n.is_running()]
            if dead:
                raise KafkaStartError(
                    f"Kafka node(s) {[n.node_id for n in dead]} exited during start-up:\n"
                    + "\n".join(n.log_tail() for n in dead)
                )
            try:
                metadata = admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                seen = len(metadata.brokers)
                # Brokers listed is not enough after a pause or restart: admin requests (create
                # topic) fail with "waiting for controller" until metadata names one again.
                if seen >= expected and metadata.controller_id >= 0:
                    # Listed brokers and a named controller are still not enough right after a
                    # SIGSTOP/SIGCONT: the next CreateTopics once went unanswered for its whole
                    # 30 s (CI, test_answer_bounds[SIGSTOP-push] behind [SIGSTOP-poll]). So the
                    # controller must answer one: a validate-only create (nothing is created;
                    # a fenced broker makes it fail, and the loop waits on).
                    probe = NewTopic(READY_PROBE_TOPIC, 1, 1)
                    for future in admin.create_topics(
                        [probe], validate_only=True, request_timeout=READY_PROBE_TIMEOUT_S
                    ).values():
                        future.result(timeout=READY_PROBE_TIMEOUT_S + 1.0)
                    return
            except Exception:  # not up yet: librdkafka raises KafkaException on timeout
                pass
            time.sleep(METADATA_POLL_S)  # polling a process we cannot get an event from
        raise KafkaStartError(
            f"Kafka cluster at {self.bootstrap_servers} served {max(seen, 0)} of {expected} brokers "
            f"after {timeout_s:.0f} s:\n" + "\n".join(n.log_tail() for n in self.nodes.values())
        )

    def stop(self) -> None:
        """Stop every node by PID and drop the state file.

        Every node is sent SIGTERM before any is waited for: a broker's controlled shutdown needs
        an answer from the controller quorum, and with three voters stopped one by one the last
        two would wait out the bound with no quorum left to answer them.
        """
        atexit.unregister(self.stop)
        for node in self.nodes.values():
            node.begin_stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in self.nodes.values():
            node.finish_stop(max(0.0, deadline - time.monotonic()))
        if self.work_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.work_dir / STATE_FILE).unlink()
            if not self.keep_work_dir and not self._work_dir_given:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- fault injection ------------------------------------------------------------------------

    def node(self, node_id: int) -> KafkaNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise UnknownNodeError(node_id, sorted(self.nodes)) from None

    def stop_broker(self, node_id: int) -> None:
        """Controlled shutdown (SIGTERM; SIGKILL after a bound), waited for."""
        self.node(node_id).stop()
        self.save_state()

    def kill_broker(self, node_id: int) -> None:
        """SIGKILL (a crash), waited for."""
        self.node(node_id).kill()
        self.save_state()

    def start_broker(self, node_id: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Restart a stopped node and wait until metadata lists every running broker again."""
        node = self.node(node_id)
        if not node.classpath:
            # A handle from a state file written before the classpath was recorded there.
            node.classpath = str(resolve_kafka(self.version) / "*")
        node.start()
        self.save_state()
        self.wait_ready(timeout_s)

    def pause_broker(self, node_id: int) -> None:
        """SIGSTOP one node; a no-op on a node not running (see :meth:`running_node`)."""
        self.node(node_id).pause()

    def resume_broker(self, node_id: int) -> None:
        """SIGCONT one node; a no-op on a node not running (see :meth:`running_node`)."""
        self.node(node_id).resume()

    def running_node(self, node_id: int) -> KafkaNode:
        """The node, if its JVM runs (paused included); :class:`NodeNotRunningError` otherwise —
        for callers (the CLI) to whom a pause or resume of a stopped node is a mistake."""
        node = self.node(node_id)
        if not node.is_running():
            raise NodeNotRunningError(f"node {node_id} is not running (start-node {node_id} first)")
        return node

    def log_tail(self) -> str:
        return "\n".join(n.log_tail() for n in self.nodes.values())

    # -- state file (for ``purgatory kafka down`` from another process) -------------------------

    def save_state(self) -> None:
        # Not before start() laid the cluster out, nor after stop() removed it.
        if self.work_dir is None or not self.nodes or not self.work_dir.is_dir():
            return
        state = {
            "version": self.version,
            "cluster_id": self.cluster_id,
            "bootstrap_servers": self.bootstrap_servers,
            "work_dir": str(self.work_dir),
            # What restarting a node from another process needs (``from_state(...).start_broker``).
            "heap_mb": self.heap_mb,
            "jvm_options": list(self.jvm_options),
            "detach": self.detach,
            "nodes": [
                {**asdict(n.spec), "pid": n.pid, "classpath": n.classpath} for n in self.nodes.values()
            ],
        }
        (self.work_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def from_state(cls, work_dir: str | Path) -> LocalKafkaCluster:
        """Rebuild a handle on a cluster started by another process (to stop or restart its nodes,
        or ask their status)."""
        path = Path(work_dir) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise NoLocalClusterError(f"no local Kafka cluster state at {path}") from None
        cluster = cls(
            len(state["nodes"]),
            # The voters are the nodes with a controller port (older state files: node 1 alone).
            controllers=sum(1 for n in state["nodes"] if n.get("controller_port") is not None) or 1,
            version=state["version"],
            work_dir=work_dir,
            heap_mb=state.get("heap_mb", DEFAULT_HEAP_MB),
            detach=state.get("detach", True),
            jvm_options=state.get("jvm_options", FAST_START_JVM_OPTIONS),
        )
        cluster._work_dir_given = False  # a handle from state owns the directory it describes
        cluster.cluster_id = state["cluster_id"]
        for entry in state["nodes"]:
            spec = NodeSpec(entry["node_id"], entry["broker_port"], entry["controller_port"])
            node = KafkaNode(
                spec,
                Path(work_dir) / f"node-{spec.node_id}",
                entry.get("classpath", ""),  # "": resolved by start_broker when needed
                cluster.heap_mb,
                cluster.jvm_options,
                die_with_parent=not cluster.detach,
            )
            node.pid = entry["pid"]
            cluster.nodes[spec.node_id] = node
        return cluster

    def running_nodes(self) -> Iterator[KafkaNode]:
        return (n for n in self.nodes.values() if n.is_running())


STATE_FILE = "state.json"
