"""What every benchmark measures with: percentiles, a process's CPU and RSS, its threads' CPU, GC
activity, and its own child processes (stopped by PID; run to the JSON line they print).

One copy for every bench under ``tools/bench`` (the Kafka, produce, service, request-reply and
core benches each had their own, and the copies had begun to differ in how they read ``/proc``
and which rank a percentile is). Percentiles are ``statistics.quantiles``'; process CPU and RSS
are psutil's. Thread *names* are Linux's ``/proc`` (psutil does not give them).
"""

from __future__ import annotations

import gc
import json
import math
import signal
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

__all__ = [
    "ChildFailed",
    "ChildServer",
    "GcMeter",
    "ThreadTimes",
    "cpu_seconds",
    "cpu_seconds_of",
    "percentile",
    "result_of_child",
    "rss_bytes",
    "stop_child",
    "thread_times",
]

# Cut points statistics.quantiles computes: every quantile asked for is a multiple of 1/10,000.
_QUANTILE_CUTS = 10_000


class GcMeter:
    """Counts cyclic-GC collections per generation, and the time they took, inside a ``with``.

    Kafka's TestPurgatoryPerformance reports the JVM collectors' counts and times; this is
    CPython's equivalent (``gc.callbacks``), so GC's share of a run is visible next to its time.
    """

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.counts[int(info["generation"])] += 1

    def reset(self) -> None:
        """Forget what was counted so far (a run's own start-up collection is not its GC)."""
        self.counts = [0, 0, 0]
        self.seconds = 0.0

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self._callback)

    def as_dict(self) -> dict[str, Any]:
        return {"gc_counts": list(self.counts), "gc_ms": round(self.seconds * 1000.0, 3)}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``: ``statistics.quantiles``' "inclusive" method, the
    value at position ``q * (n - 1)`` of the sorted values, interpolated between the two ranks
    around it (min at 0, max at 1); NaN when empty. ``q`` is rounded to 1/10,000."""
    if not values:
        return math.nan
    if len(values) == 1 or q <= 0.0:
        return float(min(values))
    if q >= 1.0:
        return float(max(values))
    cut = min(_QUANTILE_CUTS - 1, max(1, round(q * _QUANTILE_CUTS)))
    return float(statistics.quantiles(values, n=_QUANTILE_CUTS, method="inclusive")[cut - 1])


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid``."""
    return int(psutil.Process(pid).memory_info().rss)


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` so far (or of its thread ``tid``)."""
    process = psutil.Process(pid)
    if tid is None:
        times = process.cpu_times()
        return float(times.user + times.system)
    for thread in process.threads():
        if thread.id == tid:
            return float(thread.user_time + thread.system_time)
    raise psutil.NoSuchProcess(pid, msg=f"no thread {tid}")


def cpu_seconds_of(pids: Iterable[int]) -> float:
    """User + system CPU seconds of ``pids`` so far, summed; a process gone counts 0."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except psutil.NoSuchProcess:
            continue
    return total


@dataclass(frozen=True)
class ThreadTimes:
    """One thread of a process: its id, its name (the kernel's, cut to 15 characters), its user +
    system CPU seconds and its context switches (voluntary + involuntary) so far."""

    tid: int
    name: str
    cpu_s: float
    switches: int


def thread_times(pid: int) -> list[ThreadTimes]:
    """The threads of process ``pid`` (a thread gone meanwhile is left out; none if the process is).

    Linux ``/proc``: psutil gives a thread's CPU but not its name, and the benches pick threads by
    name (the JVMs' JIT compiler threads, the Python threads of a trace).
    """
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return []
    found = []
    for thread in threads:
        task = Path(f"/proc/{pid}/task/{thread.id}")
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:
            continue
        switches = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)
        found.append(ThreadTimes(thread.id, name, thread.user_time + thread.system_time, switches))
    return found


def stop_child(process: subprocess.Popen[Any], timeout_s: float) -> None:
    """Stop our own child by its PID: SIGTERM (it shuts down cleanly), SIGKILL past ``timeout_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)


class ChildServer:
    """An HTTP server under test in a child process of ours, on ``127.0.0.1:port``: ready when its
    ``/healthz`` answers 200; stopped by its PID (SIGTERM, then SIGKILL past ``stop_timeout_s``).
    Its stdout is dropped, its stderr kept for the error when it dies before it is ready."""

    def __init__(
        self, command: Sequence[str], env: Mapping[str, str], port: int, *, stop_timeout_s: float
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.stop_timeout_s = stop_timeout_s
        self.process = subprocess.Popen(  # our own interpreter and module
            list(command), env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.pid = self.process.pid

    def wait_ready(self, timeout_s: float, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {self.stderr_tail()}")
            try:
                wait_s = max(0.1, min(30.0, deadline - time.monotonic()))
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=wait_s) as response:  # loopback
                    if response.status == 200:
                        return
            except OSError:  # not listening yet, or 503 while starting
                pass
            time.sleep(poll_s)
        raise RuntimeError(f"the server did not come up within {timeout_s:.0f} s")

    def stderr_tail(self) -> str:
        if self.process.stderr is None:
            return ""
        return self.process.stderr.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        stop_child(self.process, self.stop_timeout_s)
        if self.process.stderr is not None:
            self.process.stderr.close()

    def kill(self) -> None:
        """SIGKILL now (a server past a memory cap must not take the machine's memory)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(self.stop_timeout_s)


class ChildFailed(RuntimeError):
    """A child process ended without printing its result line (its exit code and output tail)."""


def result_of_child(
    command: Sequence[str], *, env: Mapping[str, str], timeout_s: float, marker: str
) -> dict[str, Any]:
    """Run ``command`` to its end and return the JSON printed after ``marker`` on its stdout (the
    last such line). Raises :class:`ChildFailed` with the exit code and the last lines of its
    stderr (else stdout) when there is none."""
    proc = subprocess.run(
        list(command), capture_output=True, text=True, env=dict(env), timeout=timeout_s, check=False
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(marker):
            result: dict[str, Any] = json.loads(line[len(marker) :])
            return result
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
    raise ChildFailed(f"exit {proc.returncode}:\n{tail}")
