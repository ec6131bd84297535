"""What the adapters' benchmarks share: percentiles, a child process's RSS and CPU, stopping it,
and running one side of a comparison in a fresh process for the JSON line it prints.

One copy each, for the Kafka, produce and service benches and the tools built on them (each had
its own, and the copies had begun to differ in how they read ``/proc``). Linux only (``/proc``),
as the benches are.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ChildFailed", "cpu_seconds", "pct", "result_of_child", "rss_bytes", "stop_child"]

_TICKS = os.sysconf("SC_CLK_TCK")


def pct(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values (the value at index ``q * n``); NaN when empty."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` so far (or of its thread ``tid``)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    # The command name may hold spaces: split after its ')'; utime and stime are then 12th and 13th.
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def stop_child(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Stop our own child by its PID: SIGTERM (it shuts down cleanly), SIGKILL past ``timeout_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)


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
