"""LocalInstances: several instances of the service as subprocesses on loopback ports (tests, bench).

``with LocalInstances(bootstrap, topics=[t], group_id=g) as fleet: a = fleet.start()`` starts
``python -m purgatory.adapters.service.serve`` on a socket this process bound on 127.0.0.1 port 0
and hands over (``--fd``: no race between choosing a port and binding it); the instance
advertises ``http://127.0.0.1:<port>`` through the ownership group. ``fleet.kill(a)`` sends
SIGKILL, ``fleet.stop(a)`` SIGTERM (graceful: the instance leaves its group, answers what it holds
MOVED, drains); leaving the ``with`` block stops every instance still running, by PID, bounded.
Each instance's output goes to ``<log_dir>/instance-<port>.log``. The instances of one fleet share
a ``scaleout.secret`` made for it (``fleet.secret``): they trust each other and no one else.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

__all__ = ["Instance", "InstanceStartError", "LocalInstances"]

START_TIMEOUT_S = 30.0  # interpreter start, imports, the lifespan startup (no Kafka round trip)
STOP_TIMEOUT_S = 30.0  # graceful: leave the group, graceful wait (bounded), drain
KILL_WAIT_S = 10.0
READY_POLL_S = 0.05  # /healthz has no push: poll it, bounded


class InstanceStartError(RuntimeError):
    """An instance did not answer /healthz in time (its log is named)."""


@dataclass
class Instance:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    stopped: bool = field(default=False)

    @property
    def pid(self) -> int:
        return self.process.pid


class LocalInstances:
    """Instances of the service in one ownership group (see the module docstring)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topics: Sequence[str],
        group_id: str,
        env: Mapping[str, str] | None = None,
        log_dir: str | Path | None = None,
        session_timeout_ms: int = 6000,
        graceful_shutdown_s: int = 10,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.log_dir = (
            Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="purgatory-fleet-"))
        )
        self.graceful_shutdown_s = graceful_shutdown_s
        self.secret = secrets.token_hex(32)  # scaleout.secret of this fleet's instances
        self.env = {
            "PURGATORY_KAFKA__BOOTSTRAP_SERVERS": bootstrap_servers,
            "PURGATORY_SCALEOUT__ENABLED": "true",
            "PURGATORY_SCALEOUT__GROUP_ID": group_id,
            "PURGATORY_SCALEOUT__TOPICS": "[" + ",".join(f'"{t}"' for t in topics) + "]",
            "PURGATORY_SCALEOUT__SESSION_TIMEOUT_MS": str(session_timeout_ms),
            "PURGATORY_SCALEOUT__HEARTBEAT_INTERVAL_MS": str(max(100, session_timeout_ms // 6)),
            "PURGATORY_SCALEOUT__SECRET": self.secret,
            "PURGATORY_LOG__FORMAT": "json",
            **(env or {}),
        }
        self.instances: list[Instance] = []

    def start(
        self, extra_env: Mapping[str, str] | None = None, timeout_s: float = START_TIMEOUT_S
    ) -> Instance:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        log_path = self.log_dir / f"instance-{port}.log"
        env = {**os.environ, **self.env, **(extra_env or {})}
        env.pop("PURGATORY_KAFKA_BOOTSTRAP", None)  # the fleet's cluster, not the caller's default
        with listener, log_path.open("wb") as log:
            command = [
                sys.executable, "-m", "purgatory.adapters.service.serve",
                "--fd", str(listener.fileno()),
                "--graceful-shutdown-s", str(self.graceful_shutdown_s),
            ]  # fmt: skip
            process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, pass_fds=(listener.fileno(),)
            )
        instance = Instance(f"http://127.0.0.1:{port}", port, process, log_path)
        self.instances.append(instance)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise InstanceStartError(
                    f"instance on port {port} exited {process.returncode}; see {log_path}"
                )
            try:
                if httpx.get(f"{instance.url}/healthz", timeout=1.0).status_code == 200:
                    return instance
            except httpx.HTTPError:
                pass
            time.sleep(READY_POLL_S)
        self.kill(instance)
        raise InstanceStartError(
            f"instance on port {port} not ready within {timeout_s:.0f} s; see {log_path}"
        )

    def running(self) -> list[Instance]:
        return [i for i in self.instances if not i.stopped and i.process.poll() is None]

    def kill(self, instance: Instance) -> None:
        """SIGKILL: no goodbye; the group notices after its session timeout."""
        instance.stopped = True
        if instance.process.poll() is None:
            instance.process.send_signal(signal.SIGKILL)
        instance.process.wait(KILL_WAIT_S)

    def stop(self, instance: Instance, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait (bounded; SIGKILL after); returns the exit code."""
        instance.stopped = True
        if instance.process.poll() is None:
            instance.process.send_signal(signal.SIGTERM)
            try:
                return instance.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                instance.process.kill()
        return instance.process.wait(KILL_WAIT_S)

    def owners(self, instance: Instance, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The instance's ``/owners`` document (``headers``: e.g. its bearer token when auth is on)."""
        document: dict[str, Any] = httpx.get(f"{instance.url}/owners", headers=headers, timeout=5.0).json()
        return document

    def close(self) -> None:
        for instance in self.instances:
            if instance.process.poll() is None:
                self.stop(instance)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
