"""The local Apache Kafka launcher: CLI, failed starts, provider order."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from purgatory.adapters.kafka import (
    BOOTSTRAP_ENV,
    KafkaStartError,
    LocalKafkaCluster,
    docker_available,
    provide_cluster,
)
from purgatory.adapters.kafka.local import (
    FAST_START_JVM_OPTIONS,
    STEADY_STATE_JVM_OPTIONS,
    KafkaNode,
    NodeSpec,
)

pytestmark = pytest.mark.kafka

PURGATORY = [str(Path(sys.executable).with_name("purgatory"))]  # the console script of this venv
CLI_TIMEOUT_S = 120


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PURGATORY, *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


def test_cli_up_status_down_from_separate_processes() -> None:
    name = f"it-{uuid.uuid4().hex[:6]}"
    up = _cli("kafka", "up", "--name", name)
    try:
        assert up.returncode == 0, up.stderr
        assert "export PURGATORY_KAFKA_BOOTSTRAP=127.0.0.1:" in up.stdout
        status = _cli("kafka", "status", "--name", name)
        assert status.returncode == 0 and "running" in status.stdout, status.stdout
    finally:
        down = _cli("kafka", "down", "--name", name)
    assert down.returncode == 0 and "stopped" in down.stdout
    after = _cli("kafka", "status", "--name", name)
    assert after.returncode == 1, "no cluster left after down"


def test_failed_start_raises_with_the_tail_of_the_broker_log(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(
        brokers=1, work_dir=tmp_path / "bad", broker_config={"authorizer.class.name": "no.such.Authorizer"}
    )
    with pytest.raises(KafkaStartError) as failure:
        cluster.start(timeout_s=60)
    message = str(failure.value)
    assert "--- node 1" in message and "no.such.Authorizer" in message, message[-2000:]
    assert not any(node.is_running() for node in cluster.nodes.values()), "nothing left running"


def test_provider_uses_an_existing_cluster_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BOOTSTRAP_ENV, "kafka.example:9092")
    handle = provide_cluster()
    assert handle.provider == "existing" and handle.bootstrap_servers == "kafka.example:9092"
    assert handle.local is None
    handle.stop()  # not ours: nothing to stop, and no error


def test_docker_check_answers_quickly_without_an_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-docker.sock'}")
    started = time.monotonic()
    assert docker_available() is False
    assert time.monotonic() - started < 1.0


def test_local_cluster_stop_leaves_no_process(tmp_path: Path) -> None:
    with LocalKafkaCluster(brokers=1, work_dir=tmp_path / "k") as cluster:
        pids = [node.pid for node in cluster.nodes.values()]
        assert all(pid is not None for pid in pids)
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_nodes_start_c1_only_by_default_for_a_fast_start(tmp_path: Path) -> None:
    node = KafkaNode(NodeSpec(1, 1, 2), tmp_path, "libs/*", 256)
    command = node.format_command("id")
    assert all(option in command for option in FAST_START_JVM_OPTIONS)
    assert "-XX:TieredStopAtLevel=1" in command
    assert LocalKafkaCluster(brokers=1).jvm_options == FAST_START_JVM_OPTIONS


@pytest.mark.parametrize(
    ("options", "named"),
    [("-XX:+UseSerialGC", "string"), (["UseSerialGC"], "UseSerialGC"), (["-Xmx2g"], "heap_mb")],
)
def test_jvm_options_that_are_not_options_raise_naming_the_option(options: list[str], named: str) -> None:
    with pytest.raises(ValueError, match="jvm_options") as failure:
        LocalKafkaCluster(brokers=1, jvm_options=options)
    assert named in str(failure.value)


def test_a_full_jit_cluster_runs_its_jvm_options_and_keeps_them_for_restarts(tmp_path: Path) -> None:
    work_dir = tmp_path / "full-jit"
    with LocalKafkaCluster(brokers=1, work_dir=work_dir, jvm_options=STEADY_STATE_JVM_OPTIONS) as cluster:
        pid = cluster.node(1).pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"-XX:+UseSerialGC" in argv and b"-XX:TieredStopAtLevel=1" not in argv, argv[:8]
        # A handle rebuilt by another process (``purgatory kafka down``/restarts) keeps the options.
        assert LocalKafkaCluster.from_state(work_dir).jvm_options == STEADY_STATE_JVM_OPTIONS


def test_down_never_signals_a_pid_that_is_no_longer_our_broker(tmp_path: Path) -> None:
    """A state file outliving its cluster may name a PID the system has given to someone else."""
    import json

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        work_dir = tmp_path / "stale"
        (work_dir / "node-1").mkdir(parents=True)
        state = {
            "version": "4.3.1",
            "cluster_id": "x",
            "bootstrap_servers": "127.0.0.1:1",
            "work_dir": str(work_dir),
            "nodes": [{"node_id": 1, "broker_port": 1, "controller_port": 2, "pid": stranger.pid}],
        }
        (work_dir / "state.json").write_text(json.dumps(state))
        cluster = LocalKafkaCluster.from_state(work_dir)
        assert not cluster.node(1).is_running(), "the PID runs something else than our broker"
        cluster.stop()
        assert stranger.poll() is None, "the unrelated process was left alone"
    finally:
        stranger.kill()
        stranger.wait(10)


def test_brokers_die_with_a_test_process_that_is_killed_outright(tmp_path: Path) -> None:
    script = (
        "import os, signal, sys\n"
        "from purgatory.adapters.kafka import LocalKafkaCluster\n"
        f"cluster = LocalKafkaCluster(brokers=1, work_dir={str(tmp_path / 'k')!r}).start()\n"
        "print('BROKER_PID', cluster.node(1).pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)  # no teardown, no atexit\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    broker_pid = int(
        next(line for line in child.stdout.splitlines() if line.startswith("BROKER_PID")).split()[1]
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(broker_pid):
        time.sleep(0.1)  # the kernel's SIGTERM starts a controlled shutdown we cannot await
    alive = _alive(broker_pid)
    if alive:
        os.kill(broker_pid, 9)
    assert not alive, "the broker outlived the process that started it"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
