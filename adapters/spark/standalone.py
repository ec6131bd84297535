"""LocalSparkStandalone: a Spark standalone master and workers on loopback, from pyspark's own jars.

The analytics scale out on Spark's own cluster manager: ``purgatory analyze --master
spark://host:7077`` runs the same job on a standalone cluster (or YARN, Kubernetes) as on
``local[*]``. This starts such a cluster on one machine for tests and trials::

    with LocalSparkStandalone(workers=2) as cluster:
        subprocess.run(["purgatory", "analyze", "--path", "journal/", "--master", cluster.master_url])

Master and workers are ``bin/spark-class org.apache.spark.deploy.{master.Master,worker.Worker}``
of the installed pyspark (no separate Spark download), in the foreground as children of this
process: ``spark-class`` execs the JVM, so each child's PID is its JVM's, and ``stop()`` ends
them by PID (SIGTERM, then SIGKILL after a bound). They bind 127.0.0.1 on ports the JVM picks
(``--port 0``); the master's URL is read from its log. Every wait is bounded.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from ._session import LOOPBACK, prepare_environment

__all__ = ["LocalSparkStandalone", "SparkClusterError"]

START_TIMEOUT_S = 90.0  # JVM starts on a busy 2-core machine, then every worker registering
STOP_TIMEOUT_S = 15.0
POLL_S = 0.2  # the logs are the only signal of readiness: read them, bounded
DAEMON_MEMORY = "256m"  # master and worker daemons only schedule; executors get their own heap
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Registering worker"


class SparkClusterError(RuntimeError):
    """The local standalone cluster did not come up (its logs are named)."""


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class LocalSparkStandalone:
    """A master and ``workers`` workers of Spark standalone on loopback (see the module docstring)."""

    def __init__(
        self,
        workers: int = 2,
        *,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        work_dir: str | Path | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.work_dir = (
            Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="spark-standalone-"))
        )
        self.master_url = ""
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def _spawn(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        home = _spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_WORKER_DIR": str(self.work_dir / "work"),
            "SPARK_NO_DAEMONIZE": "1",
        }
        log_path = self.work_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, not the JVMs: we stop them
            )
        self._processes.append(process)
        return process, log_path

    def _wait_for(self, log_path: Path, process: subprocess.Popen[bytes], pattern: str, count: int) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace") if log_path.exists() else ""
            if len(re.findall(pattern, text)) >= count:
                return text
            if process.poll() is not None:
                raise SparkClusterError(f"{log_path.stem} exited {process.returncode}; see {log_path}")
            time.sleep(POLL_S)
        raise SparkClusterError(
            f"{log_path.stem}: no {pattern!r} within {START_TIMEOUT_S:.0f} s; see {log_path}"
        )

    def start(self) -> Self:
        prepare_environment()  # Java present, SPARK_LOCAL_IP
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            master, master_log = self._spawn(
                "master", "org.apache.spark.deploy.master.Master",
                "--host", LOOPBACK, "--port", "0", "--webui-port", "0",
            )  # fmt: skip
            match = _MASTER_URL.search(self._wait_for(master_log, master, _MASTER_URL.pattern, 1))
            assert match is not None, "the pattern was just found"
            self.master_url = match.group(1)
            for index in range(self.workers):
                self._spawn(
                    f"worker-{index + 1}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--host", LOOPBACK, "--port", "0", "--webui-port", "0",
                    "--cores", str(self.cores_per_worker), "--memory", self.memory_per_worker,
                    "--work-dir", str(self.work_dir / f"work-{index + 1}"),
                )  # fmt: skip
            self._wait_for(master_log, master, _REGISTERED, self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM every JVM this started (by PID), SIGKILL what is left after a bound; workers first."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in reversed(self._processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        self._processes.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
