"""One node of the local cluster: its spec, its JVM process (start, stop by PID, kill, pause),
its configuration files, and the free loopback ports and KRaft voters of a layout.

Split from :mod:`._cluster` (which lays out and drives the whole cluster): everything here is
about a single JVM or a single choice of ports, and holds no cluster-wide state but the
spawner thread that starts JVMs (see :func:`_spawner`).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog

from ..clients._errors import (
    KafkaLauncherError,
)

__all__ = [
    "DEFAULT_HEAP_MB",
    "FAST_START_JVM_OPTIONS",
    "STEADY_STATE_JVM_OPTIONS",
    "KafkaNode",
    "NodeSpec",
    "NodeState",
    "checked_jvm_options",
    "free_port",
    "free_ports",
    "kafka_uuid",
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


def kafka_uuid() -> str:
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


def checked_jvm_options(options: Sequence[str]) -> tuple[str, ...]:
    """The options as a tuple; a typed error names the first that is not a JVM option."""
    if isinstance(options, str):
        raise ValueError(f"jvm_options must be a sequence of options, got the string {options!r}")
    for option in options:
        if not isinstance(option, str) or not option.startswith("-") or option.strip() != option:
            raise ValueError(f"jvm_options: {option!r} is not a JVM option (one '-...' word each)")
        if option.startswith(("-Xmx", "-cp", "-classpath")):
            raise ValueError(f"jvm_options: {option!r} is set by the launcher (use heap_mb)")
    return tuple(options)
