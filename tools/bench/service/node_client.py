"""``purgatory bench fanout --client node``: the long polls sent and read by a client that is not ours.

The bench's own clients (:mod:`.h1_client`, :mod:`.h2_client`) are built to cost the least: raw
sockets read from one epoll thread, a hand-written HTTP/2 frame reader. Issue 30 asks for figures
that do not rest on those shortcuts, so the same case also runs with Node's own HTTP stacks
(``http`` with one connection per long poll, ``http2`` with many streams per session) in a Node
process of its own (``fanout_client.mjs``, beside this module; its header says the protocol).

Answer times are comparable with the produce times the bench takes: Node's ``process.hrtime`` and
Python's ``time.monotonic_ns`` both read ``CLOCK_MONOTONIC`` on Linux. Node keeps every answer in
memory and writes one line at the first answer (so the burst probe starts) and the rest at the
end, so no pipe write competes with the burst. The process is ours and stopped by its PID.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path

from ..measure import stop_child
from .foreign_client import STOP_TIMEOUT_S, ForeignLongPolls

__all__ = ["NODE_CLIENT", "NodeLongPolls"]

NODE_CLIENT = Path(__file__).with_name("fanout_client.mjs")


class NodeLongPolls(ForeignLongPolls):
    """A Node process holding ``waiters`` long polls; :attr:`polls` are filled when it ends."""

    name = "node"
    program = "node"
    reports_first = True  # its "first" line

    def __init__(
        self,
        port: int,
        topic: str,
        waiters: int,
        partitions: int,
        max_wait_ms: int,
        *,
        offset: int,
        http2_streams: int,
        timeout_s: float,
    ) -> None:
        arguments = {
            "port": port,
            "topic": topic,
            "waiters": waiters,
            "partitions": partitions,
            "offset": offset,
            "maxWaitMs": max_wait_ms,
            "protocol": "h2" if http2_streams else "h1",
            "streamsPerConnection": http2_streams or 1,
            "deadlineMs": int(timeout_s * 1000),
        }
        super().__init__(waiters, partitions, timeout_s)
        self._opened = threading.Event()
        self.process = subprocess.Popen(
            ["node", str(NODE_CLIENT), json.dumps(arguments)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.pid = self.process.pid
        self._thread = threading.Thread(target=self._read, name="node-client-reader", daemon=True)
        self._thread.start()

    def wait_opened(self) -> None:
        """Block until Node has sent every request (or raise with its stderr)."""
        if not self._opened.wait(max(0.0, self._deadline - time.monotonic())) or self._error:
            raise RuntimeError(f"the Node client did not open its long polls: {self._error or 'timeout'}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode().strip()
            if line.startswith("opened "):
                self._opened.set()
            elif line.startswith("first "):
                self.first.answered_ns = int(line.split()[1])
            elif line.startswith("{"):
                self._take(json.loads(line))
        if not self._ended.is_set():
            assert self.process.stderr is not None
            self._error = f"exit {self.process.wait()}: {self.process.stderr.read().decode()[-1000:]}"
        self._opened.set()
        self._ended.set()

    def _take(self, document: dict[str, object]) -> None:
        answers = document["answers"]
        assert isinstance(answers, list)
        for waiter, status, answered_ns, outcome in answers:
            poll = self.polls[waiter]
            poll.status = status
            poll.answered_ns = int(answered_ns)
            poll.body = json.dumps({"outcome": outcome}).encode()
        self.cpu_s = float(document.get("cpu_us", 0)) / 1e6  # type: ignore[arg-type]
        errors = document.get("errors")
        self.errors = dict(errors) if isinstance(errors, dict) else {}
        self._ended.set()

    def stop(self) -> None:
        """Ask Node to end (stdin closed: it writes what it has), then stop it by its PID."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        self._ended.wait(STOP_TIMEOUT_S)
        stop_child(self.process, STOP_TIMEOUT_S)
        self._thread.join(STOP_TIMEOUT_S)
