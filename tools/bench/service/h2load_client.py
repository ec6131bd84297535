"""``purgatory bench fanout --client h2load``: the long polls sent and read by nghttp2's ``h2load``.

A second client that is not ours, and one whose own cost is small: ``h2load`` is C (nghttp2's load
generator), ~1-3 µs of CPU per answer where Node's ``http``/``http2`` spend 35-57 µs. With Node the
p99 of a 10,000-answer burst on two shared cores is mostly Node's own work; with h2load it is the
service's. Debian and Ubuntu ship it as ``nghttp2-client``.

How the case maps onto h2load: ``-n waiters`` requests, HTTP/1.1 (``--h1``) on ``-c waiters``
connections (one poll each), or h2c (prior knowledge) on ``-c waiters/streams`` connections with
``-m streams`` concurrent streams each; every request is sent at once and waits (the polls'
``max_wait_ms`` outlasts the case). The URIs are one per partition, which each connection takes
in turn from the first: over HTTP/1.1 (one request per connection) one partition only.

What is read: h2load's ``--log-file``, one line per answer — its start (µs since the epoch), its
status, and µs until its end — written as h2load exits. The end time moves to the monotonic clock
the bench's produce times use (one offset, read once). h2load records no body: a 200 is counted
as completed, as none can expire while the case runs (``MAX_WAIT_MS``), and a line does not say
its partition, so with several partitions each answer is timed from the first partition's produce
(they are µs apart). With no answer before it exits, the burst probe is sent when the produce is
acknowledged — the burst begins 2-5 ms later, when the tail's fetch returns. CPU: h2load's
user+system from ``wait4`` when it exits, less what it had used at the produce (``/proc``).

The process is ours, bounded by the case's deadline, and stopped by its PID.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ..measure import stop_child
from .foreign_client import STOP_TIMEOUT_S, ForeignLongPolls

__all__ = ["H2loadLongPolls"]

_SUMMARY = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
    r"(\d+) failed, (\d+) errored, (\d+) timeout"
)


class H2loadLongPolls(ForeignLongPolls):
    """An h2load process holding ``waiters`` long polls; :attr:`polls` are filled when it ends."""

    name = "h2load"
    program = "h2load"
    reports_first = False  # its log is written as it exits

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
        if partitions > 1 and not http2_streams:
            # h2load starts each connection at its first URI, and an HTTP/1.1 connection here
            # sends one request: every poll would go to partition 0.
            raise ValueError("h2load sends HTTP/1.1 long polls to one partition only (partitions=1)")
        uris = [
            f"http://127.0.0.1:{port}/topics/{topic}/partitions/{p}/records?offset={offset}&max_wait_ms={max_wait_ms}"
            for p in range(partitions)
        ]
        if http2_streams:
            shape = ["-c", str(-(-waiters // http2_streams)), "-m", str(http2_streams)]
        else:
            shape = ["--h1", "-c", str(waiters), "-m", "1"]
        self._dir = tempfile.TemporaryDirectory(prefix="purgatory-h2load-")
        self._log = Path(self._dir.name) / "answers.tsv"
        # A log line does not say its partition: every answer is timed from the first one's produce.
        super().__init__(waiters, 1, timeout_s)
        self.process = subprocess.Popen(
            ["h2load", "-n", str(waiters), *shape, "-t", "1", "--log-file", str(self._log), *uris],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.process.pid
        self._thread = threading.Thread(target=self._wait, name="h2load-client", daemon=True)
        self._thread.start()

    def wait_opened(self) -> None:
        """h2load says nothing while it waits: the bench's wait for the service's registered
        fetches is what tells every poll is in."""
        if self._ended.is_set() and self._error:
            raise RuntimeError(f"h2load did not open its long polls: {self._error}")

    def _wait(self) -> None:
        assert self.process.stdout is not None
        output = self.process.stdout.read().decode(errors="replace")
        try:
            _, status, usage = os.wait4(self.pid, 0)
        except ChildProcessError:  # reaped by stop(): no usage to read
            status, usage = 0, None
        if usage is not None:
            self.cpu_s = usage.ru_utime + usage.ru_stime
            self.process.returncode = os.waitstatus_to_exitcode(status)
        summary = _SUMMARY.search(output)
        if summary is None:
            self._error = f"exit {self.process.returncode}: {output[-1000:]}"
        else:
            failed, errored, timed_out = (int(x) for x in summary.groups()[4:])
            self.errors = {
                k: v for k, v in {"failed": failed, "errored": errored, "timeout": timed_out}.items() if v
            }
            self._take()
        self._ended.set()

    def _take(self) -> None:
        # µs since the epoch -> monotonic ns: the offset between the two clocks, read once.
        offset_ns = time.monotonic_ns() - time.time_ns()
        with contextlib.suppress(FileNotFoundError):
            lines = self._log.read_text().splitlines()
            for poll, line in zip(self.polls, lines, strict=False):
                start_us, status, duration_us = line.split("\t")[:3]
                poll.status = int(status)
                poll.answered_ns = (int(start_us) + int(duration_us)) * 1000 + offset_ns
                poll.body = b'{"outcome": "COMPLETED"}' if poll.status == 200 else b"{}"

    def stop(self) -> None:
        """Stop h2load by its PID if it still runs, and remove its log."""
        if not self._ended.wait(0):
            stop_child(self.process, STOP_TIMEOUT_S)
        self._thread.join(STOP_TIMEOUT_S)
        self._dir.cleanup()
