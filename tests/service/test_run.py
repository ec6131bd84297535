"""``purgatory run`` — the README's main command — end to end, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.kafka

RUN_TIMEOUT_S = 180.0  # a cold local broker starts in ~5-20 s on 2 busy cores; the exercise takes ~3 s
ROWS = 7  # 3 polls completed by records, 2 expiring polls, 1 produce-and-wait, 1 unknown topic
PURGATORY = Path(sys.executable).with_name("purgatory")


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PURGATORY), "run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def _environment(**extra: str) -> dict[str, str]:
    """The user's environment without any Kafka or settings configuration (launcher knobs kept)."""
    kept = ("PURGATORY_KAFKA_CACHE", "PURGATORY_KAFKA_VERSION")  # where the Kafka jars are, which Kafka
    env = {k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_") or k in kept}
    return env | extra


def _check_report(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.count(" yes ") == ROWS and " NO " not in out, out
    for row in ("GET p0 long poll", "GET p2 max_wait_ms=300", "POST 3 records", "GET unknown topic"):
        assert row in out, f"{row!r} missing from the report:\n{out}"
    # The two p2 polls (300 and 800 ms) are equal: one operation (issue 30), expired with the last
    # of them; the first was answered at its own deadline without one.
    assert re.search(r'Expires_total\{delayedOperation="fetch"\} 1\.0', out), out
    assert re.search(r'Finished_total\{delayedOperation="fetch",outcome="completed"\} 3\.0', out), out
    assert "done in" in out


def test_run_without_kafka_configured_starts_a_local_cluster_and_stops_it() -> None:
    result = _run(_environment())
    _check_report(result)
    started = re.search(r"Kafka \(local\): 127\.0\.0\.1:\d+, local broker PIDs \[([\d, ]+)\]", result.stdout)
    assert started, f"a local cluster was started:\n{result.stdout}"
    pids = [int(p) for p in started.group(1).split(",")]
    assert f"stopped local Kafka (PIDs {pids})" in result.stdout
    for pid in pids:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"broker PID {pid} still running after `purgatory run`"


def test_run_uses_the_configured_cluster_and_leaves_it_running(kafka_bootstrap: str) -> None:
    # --brokers shapes only a cluster `run` starts itself: a configured one is used as it is.
    result = _run(_environment(PURGATORY_KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap), "--brokers", "3")
    _check_report(result)
    assert f"Kafka (existing): {kafka_bootstrap}" in result.stdout
    assert "stopped local Kafka" not in result.stdout
    from confluent_kafka.admin import AdminClient

    topic = re.search(r"topic (purgatory-run-\w+)", result.stdout)
    assert topic, result.stdout
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    deadline = time.monotonic() + 10.0
    # Deletion is accepted by the controller before every broker's metadata forgets the topic.
    while topic.group(1) in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "its topic was deleted from a cluster it did not start"
        time.sleep(0.1)
