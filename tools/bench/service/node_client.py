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
import shutil
import subprocess
import threading
import time
from pathlib import Path

from ..measure import cpu_seconds, stop_child

__all__ = ["NODE_CLIENT", "ForeignPoll", "NodeLongPolls", "node_available"]

NODE_CLIENT = Path(__file__).with_name("fanout_client.mjs")
STOP_TIMEOUT_S = 5.0


def node_available() -> bool:
    return shutil.which("node") is not None


class ForeignPoll:
    """One long poll of the Node client: when, and with what outcome, it was answered (as
    ``H1LongPoll``; ``body`` holds only the outcome, which is all the bench reads)."""

    __slots__ = ("answered_ns", "body", "partition", "status")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.status = 0
        self.body = b""
        self.answered_ns = 0

    def close(self) -> None:  # the Node process holds the connection
        pass


class NodeLongPolls:
    """A Node process holding ``waiters`` long polls; :attr:`polls` are filled when it ends."""

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
        self.polls = [ForeignPoll(i % partitions) for i in range(waiters)]
        self.first = ForeignPoll(0)  # answered_ns set at Node's first answer: the burst probe watches it
        self.cpu_s = 0.0  # Node's user+system CPU over its whole life, from its final line
        self.errors: dict[str, int] = {}  # Node's own errors (connect refused, reset) by message
        self._deadline = time.monotonic() + timeout_s + STOP_TIMEOUT_S
        self._opened = threading.Event()
        self._ended = threading.Event()
        self._error: str | None = None
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

    def client_cpu_s(self) -> float:
        """Node's CPU so far (while it runs)."""
        return cpu_seconds(self.pid)

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

    def join(self) -> None:
        """Wait for Node's answers (every waiter answered, or its deadline passed)."""
        self._ended.wait(max(0.0, self._deadline - time.monotonic()))
        if self._error is not None:
            raise RuntimeError(f"the Node client failed: {self._error}")

    def stop(self) -> None:
        """Ask Node to end (stdin closed: it writes what it has), then stop it by its PID."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        self._ended.wait(STOP_TIMEOUT_S)
        stop_child(self.process, STOP_TIMEOUT_S)
        self._thread.join(STOP_TIMEOUT_S)
