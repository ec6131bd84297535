"""tools/bench/measure.py: the one percentile, CPU, RSS and thread reader every bench uses."""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time

import psutil
import pytest
from purgatory.tools.bench.measure import (
    ChildServer,
    cpu_seconds,
    cpu_seconds_of,
    percentile,
    rss_bytes,
    thread_times,
)


def test_percentile_is_statistics_inclusive_quantile_at_q_times_n_minus_one() -> None:
    values = [float(v) for v in (7, 1, 3, 9, 5)]  # unsorted on purpose: sorted inside
    assert percentile(values, 0.5) == 5.0
    assert percentile(values, 0.99) == pytest.approx(1 + 0.99 * 4 * 2)  # 8.92, between 7 and 9
    assert percentile(values, 0.99) == statistics.quantiles(values, n=100, method="inclusive")[98]
    assert (percentile(values, 0.0), percentile(values, 1.0)) == (1.0, 9.0)
    assert percentile([4.0], 0.99) == 4.0
    assert math.isnan(percentile([], 0.5))


def test_cpu_rss_and_threads_of_this_process_are_read() -> None:
    started = cpu_seconds(os.getpid())
    # This thread's own clock, not process_time: other threads left by earlier tests may spend
    # the process's CPU, and that would end a process_time loop before this thread spent its
    # share. /proc counts in 10 ms ticks, so the reader may lag by up to two of them.
    deadline = time.thread_time() + 0.1
    while time.thread_time() < deadline:  # spend CPU the reader must see
        pass
    assert cpu_seconds(os.getpid()) >= started + 0.08
    assert cpu_seconds(os.getpid(), threading.get_native_id()) > 0.0
    assert 10 * 2**20 < rss_bytes(os.getpid()) < 16 * 2**30, "MBs of an interpreter, not pages"
    threads = {t.tid: t for t in thread_times(os.getpid())}
    assert threading.get_native_id() in threads, "this thread is listed, by its kernel id"
    assert threads[threading.get_native_id()].cpu_s > 0.0


def test_cpu_of_processes_gone_counts_zero() -> None:
    gone = psutil.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    assert cpu_seconds_of([gone.pid]) == 0.0
    assert thread_times(gone.pid) == []


def test_a_child_server_that_dies_before_ready_names_its_exit_and_stderr() -> None:
    command = [sys.executable, "-c", "import sys; sys.exit('no port for you')"]
    server = ChildServer(command, dict(os.environ), 9, stop_timeout_s=5.0)
    try:
        with pytest.raises(RuntimeError, match=r"exited with 1: no port for you"):
            server.wait_ready(timeout_s=30.0, poll_s=0.05)
    finally:
        server.stop()
    assert server.process.poll() is not None, "stopped by its PID"
