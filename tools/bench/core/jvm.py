"""The JVM side of ``purgatory bench purgatory --jvm``: Kafka's own DelayedOperationPurgatory.

Kafka's ``kafka-server-common`` (its purgatory and timing wheel) is resolved with Maven from the
pom next to this module into ``~/.cache/kafka-purgatory/bench-jvm-<version>/libs``, and
``PurgatoryHarness.java`` (a port of Kafka's TestPurgatoryPerformance) is compiled there with
``javac``: no jar or class file ever lands in the repository. Each run is its own ``java``
process. The Python side generates the request intervals and latencies from the bench's seed and
hands them over in a file, so the JVM runs the identical workload; the harness prints the same
figures as the Python sides (process CPU, rates, GC, expiry, exactly-once) as one JSON line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from purgatory.adapters import copy_dependencies

__all__ = ["KAFKA_VERSION", "missing_tools", "prepare", "run_jvm_side"]

KAFKA_VERSION = "4.3.1"  # the Kafka the project's local launcher runs (adapters/kafka: DEFAULT_KAFKA_VERSION)
VERSION_ENV = "PURGATORY_BENCH_KAFKA_VERSION"
CACHE_ENV = "PURGATORY_CACHE_DIR"
MAVEN_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 900.0
HARNESS = "PurgatoryHarness"


class JvmBenchError(RuntimeError):
    """The JVM side could not be prepared or run (tool missing, Maven or javac failed)."""


def missing_tools() -> list[str]:
    return [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]


def _version() -> str:
    return os.environ.get(VERSION_ENV) or KAFKA_VERSION


def _home() -> Path:
    base = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kafka-purgatory")
    return base / f"bench-jvm-{_version()}"


def _resource(name: str) -> Path:
    return Path(__file__).resolve().parent / "jvm" / name


def _run(command: list[str], what: str, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise JvmBenchError(f"{what} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        raise JvmBenchError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done


def _libs() -> Path:
    """kafka-server-common and its runtime classpath, resolved once with the adapters' Maven resolver."""
    libs: Path = copy_dependencies(
        _resource("pom.xml"),
        _home() / "libs",
        {"kafka.version": _version(), "includeScope": "runtime"},
        expect="kafka-server-common-*.jar",
        what=f"kafka-server-common {_version()}",
        timeout_s=MAVEN_TIMEOUT_S,
    )
    return libs


def _classes(libs: Path) -> Path:
    """``PurgatoryHarness`` compiled against ``libs``, recompiled when the source changes."""
    source = _resource(f"{HARNESS}.java")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    classes = _home() / f"classes-{digest}"
    if (classes / f"{HARNESS}.class").is_file():
        return classes
    staging = Path(tempfile.mkdtemp(prefix="classes-", dir=_home()))
    try:
        _run(
            ["javac", "-nowarn", "-d", str(staging), "-cp", str(libs / "*"), str(source)],
            "javac PurgatoryHarness.java",
            MAVEN_TIMEOUT_S,
        )
    except JvmBenchError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        staging.rename(classes)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return classes


def prepare() -> str:
    """Resolve and compile once; one line saying what the JVM side runs."""
    libs = _libs()
    classes = _classes(libs)
    return f"Kafka kafka-server-common {_version()} DelayedOperationPurgatory, harness in {classes}"


def run_jvm_side(bench: str, raw_params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One JVM run of ``bench`` (``purgatory`` or ``purgatory_memory``) with the Python sides'
    parameters and seed; the figures the harness printed."""
    libs = _libs()
    classpath = f"{_classes(libs)}{os.pathsep}{libs / '*'}"
    java = ["java", "-cp", classpath, HARNESS]
    rng = random.Random(seed)
    if bench == "purgatory_memory":
        keys = [
            f"fakeKey{rng.randrange(int(raw_params['key_space_size']))}"
            for _ in range(int(raw_params["keys"]))
        ]
        done = _run(
            [*java, "memory", str(int(raw_params["pending"])), *keys], "JVM memory run", RUN_TIMEOUT_S
        )
        return _result(done.stdout)
    from .purgatory_perf import PurgatoryParams, workload

    params = PurgatoryParams(**raw_params)
    params.validate()
    latencies, intervals, keys = workload(params, seed)
    with tempfile.NamedTemporaryFile("w", suffix=".workload", delete=False) as handle:
        handle.write(" ".join(keys) + "\n")
        handle.writelines(
            f"{interval} {latency}\n" for interval, latency in zip(intervals, latencies, strict=True)
        )
        path = handle.name
    try:
        done = _run([*java, "perf", path, str(params.timeout)], "JVM purgatory run", RUN_TIMEOUT_S)
    finally:
        os.unlink(path)
    return _result(done.stdout)


def _result(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    raise JvmBenchError(f"the JVM harness printed no result:\n{stdout[-2000:]}")
