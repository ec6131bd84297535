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
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import structlog

from ..clients._errors import (
    KafkaLauncherError,
    KafkaStartError,
    NodeNotRunningError,
    NoLocalClusterError,
    UnknownNodeError,
)
from ._maven import DEFAULT_KAFKA_VERSION, VERSION_ENV, cache_dir, resolve_kafka

__all__ = [
    "KafkaNode",
    "LocalKafkaCluster",
    "NodeSpec",
    "NodeState",
    "voter_ids",
]

_log = structlog.get_logger("purgatory.kafka.local")

FORMAT_TIMEOUT_S = 60.0  # one JVM start plus a few file writes
START_TIMEOUT_S = 90.0  # 3 JVMs starting on 2 busy cores take ~10-20 s; leave room
STOP_TIMEOUT_S = 20.0  # controlled shutdown of a broker normally takes 1-3 s
METADATA_POLL_S = 0.25
# wait_ready's last check: a validate-only CreateTopics of this (never created) topic.
READY_PROBE_TOPIC = "purgatory-ready-probe"
READY_PROBE_TIMEOUT_S = 3.0
LOG_TAIL_LINES = 40
# Voters of a cluster of 3 brokers or more: a majority of 3 (2) survives the loss of any one;
# 5 would survive two but start two more controllers on 2 cores and slow every commit.
QUORUM_VOTERS = 3
DEFAULT_HEAP_MB = 384  # plenty for test traffic; keeps 4 JVMs well inside a laptop's memory

# JIT/GC options of every node's JVM. Serial GC either way: one collector thread, short young
# pauses on a small heap, no concurrent threads fighting the 2 cores.
# FAST_START (the default, tests and ``purgatory kafka up``): C1 only — the JVM starts with less
# compilation work on a busy 2-core machine; test traffic is light, so slower steady-state code
# does not matter there.
FAST_START_JVM_OPTIONS: tuple[str, ...] = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
# STEADY_STATE (benchmarks): full tiered compilation (C1 then C2). Costs more CPU while the hot
# paths compile (the first seconds of traffic: warm up before measuring), then less CPU per
# request than C1-only code; see docs/performance.md (request-reply) for the measured figures.
STEADY_STATE_JVM_OPTIONS: tuple[str, ...] = ("-XX:+UseSerialGC",)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it; a race is possible but rare)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now.

    Every socket stays bound until all are chosen: calling :func:`free_port` twice may return
    the same port (the first socket is closed before the second bind, and the kernel hands the
    freed port out again), and a node whose broker and controller listeners got one port
    refuses to format (CI saw it once).
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def voter_ids(brokers: int, controllers: int | None = None) -> tuple[int, ...]:
    """The node ids of the KRaft controller voters: nodes ``1..controllers``.

    By default :data:`QUORUM_VOTERS` (1, 2, 3) from 3 brokers up and node 1 alone below: of 2
    nodes, 2 voters would need both alive (a majority of 2 is 2) — worse than 1, which at least
    survives the loss of node 2. Tested at the boundaries by ``test_voters_by_cluster_size``.
    """
    if controllers is None:
        controllers = QUORUM_VOTERS if brokers >= QUORUM_VOTERS else 1
    if isinstance(controllers, bool) or not isinstance(controllers, int) or not 1 <= controllers <= brokers:
        raise ValueError(f"controllers must be an int from 1 to brokers ({brokers}), got {controllers!r}")
    return tuple(range(1, controllers + 1))


def _kafka_uuid() -> str:
    # Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding.
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass(frozen=True)
class NodeSpec:
    """One node: its id, roles and ports. ``controller_port`` is set only on controller voters."""

    node_id: int
    broker_port: int
    controller_port: int | None


_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

# Broker settings that make a small local cluster react in test time rather than production
# time. Each value is chosen for a reason a fault test depends on.
_FAST_CLUSTER_CONFIG: dict[str, str] = {
    # Fence a dead/paused broker after 3 s instead of 9 s so its partitions move on.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    # Drop a stopped follower from the ISR after 4 s instead of 30 s.
    "replica.lag.time.max.ms": "4000",
    # Consumer groups start at once rather than waiting 3 s for more members.
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    # Deleted segments go away quickly so DeleteRecords tests do not wait.
    "log.segment.delete.delay.ms": "1000",
    # The log cleaner's dedupe buffer (Kafka: 128 MB, one byte[] allocated at start) filled a
    # third of the 384 MB heap: full collections of 0.5-0.7 s inside runs (found by `bench
    # request-reply`, which set 16 MB for its brokers). The compacted topics of tests are tiny.
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
}


NodeState = Literal["running", "paused", "stopped"]


@dataclass
class KafkaNode:
    """One Kafka JVM: formatted storage, a process, its logs. Stopped by PID."""

    spec: NodeSpec
    work_dir: Path
    classpath: str
    heap_mb: int
    jvm_options: tuple[str, ...] = FAST_START_JVM_OPTIONS
    # Die with the process that started us (Linux): a test run killed outright leaves no broker.
    die_with_parent: bool = False
    pid: int | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def node_id(self) -> int:
        return self.spec.node_id

    @property
    def config_file(self) -> Path:
        return self.work_dir / "server.properties"

    def write_config(self, voters: Sequence[NodeSpec], brokers: int, extra: Mapping[str, str]) -> None:
        spec = self.spec
        log_dir = self.work_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        roles = "broker,controller" if spec.controller_port is not None else "broker"
        listeners = [f"PLAINTEXT://127.0.0.1:{spec.broker_port}"]
        if spec.controller_port is not None:
            listeners.append(f"CONTROLLER://127.0.0.1:{spec.controller_port}")
        internal_rf = str(min(brokers, 3))
        config = {
            "process.roles": roles,
            "node.id": str(spec.node_id),
            # A static quorum (Kafka 4.x still takes it; StorageTool formats it without
            # --initial-controllers): every node, voter or not, names the same voters.
            "controller.quorum.voters": ",".join(
                f"{v.node_id}@127.0.0.1:{v.controller_port}" for v in voters
            ),
            "listeners": ",".join(listeners),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{spec.broker_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            "offsets.topic.replication.factor": internal_rf,
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": internal_rf,
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": internal_rf,
            "share.coordinator.state.topic.min.isr": "1",
            **_FAST_CLUSTER_CONFIG,
            **extra,
        }
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        (self.work_dir / "log4j2.properties").write_text(_LOG4J2.format(log_dir=log_dir))

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise KafkaLauncherError("Java ('java', 17 or newer) is not on PATH: the local Kafka needs it")
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-Xms64m",
            *self.jvm_options,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.work_dir / 'logs'}",
            "-cp",
            self.classpath,
        ]

    def format_command(self, cluster_id: str) -> list[str]:
        return [
            *self._java(),
            "kafka.tools.StorageTool",
            "format",
            # "=" form: a base64url id may start with "-", which argparse would take for an option.
            f"--cluster-id={cluster_id}",
            f"--config={self.config_file}",
            "--ignore-formatted",
        ]

    def start(self) -> None:
        if self.is_running():
            return
        out = (self.work_dir / "stdout.log").open("ab")
        try:
            preexec = _die_with_parent if self.die_with_parent and _PRCTL is not None else None

            def popen() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [*self._java(), "kafka.Kafka", str(self.config_file)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.work_dir,
                    # Own session: a terminal's Ctrl-C goes to the caller, which then stops us by PID.
                    start_new_session=True,
                    preexec_fn=preexec,
                )

            if self.die_with_parent and _PRCTL is not None:
                # PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the
                # process: a node started from a worker thread (asyncio.to_thread, an executor)
                # was SIGTERMed when that thread ended. Forked from one thread that lives as long
                # as the process, the signal means what it should: our process is gone.
                self._process = _spawner().submit(popen).result()
            else:
                self._process = popen()
        finally:
            out.close()
        self.pid = self._process.pid
        _log.info("kafka_node_started", node_id=self.node_id, pid=self.pid, port=self.spec.broker_port)

    def is_running(self) -> bool:
        """True while the JVM exists (paused included)."""
        if self.pid is None:
            return False
        if self._process is not None:
            return self._process.poll() is None
        # A PID read from a state file may have been reused by an unrelated process since.
        return _pid_alive(self.pid) and _runs_config(self.pid, self.config_file)

    def state(self) -> NodeState:
        """``running``, ``paused`` (SIGSTOP: the kernel reports it stopped) or ``stopped`` (no JVM)."""
        if not self.is_running():
            return "stopped"
        assert self.pid is not None
        return "paused" if _process_stopped(self.pid) else "running"

    @property
    def started_here(self) -> bool:
        """True iff this handle started the JVM (it holds the process, not a PID from a file)."""
        return self._process is not None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (controlled shutdown), then SIGKILL if still alive after ``timeout_s``."""
        self.begin_stop()
        self.finish_stop(timeout_s)

    def begin_stop(self) -> None:
        """SIGTERM without waiting: the cluster signals every node first (see ``finish_stop``)."""
        if self.pid is None:
            return
        if self._process is None and not self.is_running():
            self.pid = None  # gone already, or the PID now belongs to someone else: never signal it
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)  # a paused JVM cannot act on SIGTERM
            os.kill(self.pid, signal.SIGTERM)

    def finish_stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait for the exit ``begin_stop`` asked for; SIGKILL if still alive after ``timeout_s``."""
        if self.pid is None:
            return
        pid = self.pid
        if not self._wait_exit(timeout_s):
            _log.warning("kafka_node_kill", node_id=self.node_id, pid=pid, after_s=timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_exit(5.0)
        self.pid = None
        self._process = None
        _log.info("kafka_node_stopped", node_id=self.node_id, pid=pid)

    def kill(self) -> None:
        """SIGKILL at once: a crash, no controlled shutdown."""
        if self.pid is None:
            return
        if self._process is None and not self.is_running():
            self.pid = None  # as in stop(): a PID from the state file no longer ours is never signalled
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._wait_exit(5.0)
        self.pid = None
        self._process = None
        _log.info("kafka_node_killed", node_id=self.node_id)

    def pause(self) -> None:
        """SIGSTOP: the JVM freezes with its sockets open (a hung broker). No-op when not running."""
        if self.is_running():  # checked first: a PID from a state file, reused since, is never signalled
            assert self.pid is not None
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a paused JVM carries on. No-op when not running (fault tests resume every
        follower after a test, some of them stopped)."""
        if self.is_running():
            assert self.pid is not None
            os.kill(self.pid, signal.SIGCONT)

    def _wait_exit(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        if self._process is not None:
            try:
                self._process.wait(timeout=timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        while time.monotonic() < deadline:
            if self.pid is None or not _pid_alive(self.pid):
                return True
            time.sleep(0.05)  # a foreign PID (state file): no handle to wait on, so poll briefly
        return False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        parts = []
        for name in ("stdout.log", "logs/server.log"):
            path = self.work_dir / name
            if path.is_file():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(
                    f"--- node {self.node_id} {name} (last {len(text)} lines) ---\n" + "\n".join(text)
                )
        return "\n".join(parts) or f"--- node {self.node_id}: no logs ---"


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved in the parent: the child between fork and exec must only make the one call.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


_SPAWNER: ThreadPoolExecutor | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """The one thread nodes are forked from (see KafkaNode.start): it lives until the process ends."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="kafka-node-spawner")
        return _SPAWNER


def _die_with_parent() -> None:
    """In the forked child: ask the kernel for SIGTERM when the parent (thread) dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _runs_config(pid: int, config_file: Path) -> bool:
    """True iff process ``pid`` is a Kafka JVM started with ``config_file`` (Linux /proc check)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (macOS): trust the state file
    return b"kafka.Kafka" in cmdline and str(config_file).encode() in cmdline


def _process_stopped(pid: int) -> bool:
    """True iff ``pid`` is stopped by a signal (Linux /proc: state ``T``); False without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses, so split after the last ")".
    return stat.rsplit(")", 1)[-1].split()[0] == "T"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _checked_jvm_options(options: Sequence[str]) -> tuple[str, ...]:
    """The options as a tuple; a typed error names the first that is not a JVM option."""
    if isinstance(options, str):
        raise ValueError(f"jvm_options must be a sequence of options, got the string {options!r}")
    for option in options:
        if not isinstance(option, str) or not option.startswith("-") or option.strip() != option:
            raise ValueError(f"jvm_options: {option!r} is not a JVM option (one '-...' word each)")
        if option.startswith(("-Xmx", "-cp", "-classpath")):
            raise ValueError(f"jvm_options: {option!r} is set by the launcher (use heap_mb)")
    return tuple(options)


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
        self.jvm_options = _checked_jvm_options(jvm_options)
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
        self.cluster_id = _kafka_uuid()
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
