"""``purgatory bench fanout --sse``: N event streams on one partition, and what one produce costs them.

Set-up (as :mod:`.fanout`'s long polls): a real local Kafka, a fresh one-partition topic with one
record written before, the service in its own process on 127.0.0.1 (fresh per run). The client
opens N raw HTTP/1.1 connections, each ``GET .../partitions/0/stream?offset=1`` (at the end), and
one ``epoll`` thread reads them all (:class:`StreamReader`).

Figures:

* opened: streams whose 200 head arrived (the service writes it once the stream joined its group);
* RSS per stream: the service's RSS growth from its warmed-up idle state to N open streams, / N;
* idle CPU: the service's CPU over ``--idle-s`` with N streams open (heartbeats off: 60 s apart);
* produce → event: one record appended (``acks=1``), then the time from the produce call to each
  stream's event (read whole, its ``id`` checked: 2) — p50 / p99 / max, and the first;
* CPU per event: the service's CPU from the produce to the last event, / events;
* ``/healthz`` and produce at the burst: each one's time when sent as the first events arrive
  (:class:`.burst_probe.BurstProbe`, as for the long polls).

Targets: 10,000 streams, p99 <= 100 ms, <= 4 KB per stream, a ``/healthz`` and a produce sent at
the burst answered within 100 ms (issue 30).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import select
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import typer
from purgatory.adapters.kafka import provide_cluster
from purgatory.adapters.kafka.local import free_port

from purgatory.settings import load_settings

from ..measure import cpu_seconds, percentile, rss_bytes
from .burst_probe import BurstProbe
from .fanout import (
    CLIENT_GC_THRESHOLD0,
    MAX_WAIT_MS,
    TARGET_BURST_MS,
    WAIT_AT,
    ServiceProcess,
    _create_topic,
    _delete_topic,
    _warm_up,
    _written_with,
)
from .h1_client import READ_BUFFER_BYTES, H1LongPoll, open_long_polls

__all__ = [
    "SseFanoutResult",
    "StreamReader",
    "fanout_sse",
    "run_sse_case",
    "sse_median",
    "sse_missed",
    "sse_row",
]

TARGET_SSE_P99_MS = 100.0
TARGET_BYTES_PER_STREAM = 4096
EPOLL_WAIT_S = 0.2
HEARTBEAT_OFF_MS = MAX_WAIT_MS  # no heartbeat while a run measures (nor the group's re-poll)
EXPECTED_ID = b"id: %d\n" % (WAIT_AT + 1)  # the event of the one record appended at offset WAIT_AT


@dataclass(frozen=True)
class SseFanoutResult:
    streams: int
    opened: int
    open_s: float
    rss_per_stream_bytes: float
    idle_cpu_pct: float
    event_first_ms: float
    event_p50_ms: float
    event_p99_ms: float
    event_max_ms: float
    event_cpu_us: float
    received: int
    wrong: int  # events with another id, or streams closed before their event
    load_average: tuple[float, float, float]
    burst_healthz_ms: float = float("nan")  # a /healthz sent as the first events arrive
    burst_produce_ms: float = float("nan")  # a produce sent right after it


class _Stream:
    __slots__ = ("buffer", "event_ns", "opened", "wrong")

    def __init__(self) -> None:
        self.buffer = b""
        self.opened = False
        self.event_ns = 0
        self.wrong = False

    @property
    def answered_ns(self) -> int:  # what the burst probe watches
        return self.event_ns


class StreamReader:
    """One thread reading every stream's head, then its first event, from one ``epoll`` set."""

    def __init__(self, polls: list[H1LongPoll], deadline: float) -> None:
        self.socks = {poll.sock.fileno(): poll.sock for poll in polls}
        self.streams = {fd: _Stream() for fd in self.socks}
        self.opened = 0
        self.done = 0  # streams with their event (or failed)
        self._deadline = deadline
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._read, name="fanout-sse-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def wait_done(self) -> None:
        while self.done < len(self.streams) and time.monotonic() < self._deadline:
            time.sleep(0.01)

    def _read(self) -> None:
        # This thread's CPU shares the two cores with the service's sends during a burst: names
        # are bound once, and an event arriving whole on an opened stream takes the short path.
        buffer = bytearray(READ_BUFFER_BYTES)
        view = memoryview(buffer)
        streams = self.streams
        receivers = {fd: sock.recv_into for fd, sock in self.socks.items()}
        now_ns = time.monotonic_ns
        received = self._received
        with select.epoll() as epoll:
            for fd in self.socks:
                epoll.register(fd, select.EPOLLIN)
            poll, most = epoll.poll, len(self.socks)
            while not self._stopping.is_set() and time.monotonic() < self._deadline:
                for fd, _ in poll(EPOLL_WAIT_S, most):
                    try:
                        n = receivers[fd](buffer)
                    except BlockingIOError:
                        continue
                    except OSError:
                        n = 0
                    stream = streams[fd]
                    if n == 0:
                        epoll.unregister(fd)
                        if not stream.event_ns:
                            stream.wrong = True
                            stream.event_ns = now_ns()
                            self.done += 1
                        continue
                    if stream.event_ns:
                        continue  # its event is in: nothing else is read
                    if (
                        stream.opened
                        and not stream.buffer
                        and buffer[n - 1] == buffer[n - 2] == 10
                        and buffer.startswith(b"id: ")
                    ):
                        stream.event_ns = now_ns()  # an event, whole: its id checked off the clock
                        stream.wrong = not buffer.startswith(EXPECTED_ID)
                        self.done += 1
                        continue
                    received(stream, bytes(view[:n]), now_ns())

    def _received(self, stream: _Stream, data: bytes, now_ns: int) -> None:
        if stream.event_ns:
            return
        data = stream.buffer + data
        if not stream.opened:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                stream.buffer = data
                return
            stream.opened = True
            if data[9:12] != b"200":
                stream.wrong = True
                stream.event_ns = now_ns
                self.done += 1
                return
            self.opened += 1
            data = data[end + 4 :]
        at = data.find(b"id: ")
        if at < 0:  # no event yet: whole blocks before it (the retry field) are dropped
            end = data.rfind(b"\n\n")
            stream.buffer = data[end + 2 :] if end >= 0 else data
            return
        if data.find(b"\n\n", at) < 0:  # an event not whole yet
            stream.buffer = data
            return
        stream.wrong = not data.startswith(EXPECTED_ID, at)
        stream.event_ns = now_ns
        stream.buffer = b""
        self.done += 1


async def _case(
    service: ServiceProcess,
    producer: object,
    topic: str,
    n: int,
    idle_s: float,
    timeout_s: float,
    probe_topic: str,
) -> SseFanoutResult:
    port = int(service.url.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout_s
    rss0 = rss_bytes(service.pid)
    started = time.monotonic()
    polls = await open_long_polls(port, topic, n, 1, MAX_WAIT_MS, offset=WAIT_AT, resource="stream")
    reader = StreamReader(polls, deadline)
    reader.start()
    try:
        while reader.opened + reader.done < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        open_s = time.monotonic() - started
        await asyncio.sleep(0.5)  # the openings' one-off objects collected (their polls finished)
        rss1 = rss_bytes(service.pid)
        cpu0, t0 = cpu_seconds(service.pid), time.monotonic()
        await asyncio.sleep(idle_s)
        idle_cpu_pct = 100.0 * (cpu_seconds(service.pid) - cpu0) / (time.monotonic() - t0)
        probe = BurstProbe(
            port, probe_topic, list(reader.streams.values()), max(1.0, deadline - time.monotonic())
        )
        probe.start()
        cpu_before = cpu_seconds(service.pid)
        produced_ns = time.monotonic_ns()
        producer.produce(topic, b"fanout-sse", partition=0)  # type: ignore[attr-defined]
        producer.flush(10)  # type: ignore[attr-defined]
        await asyncio.to_thread(reader.wait_done)
        event_cpu_s = cpu_seconds(service.pid) - cpu_before
        await asyncio.to_thread(probe.join)
    finally:
        reader.stop()
        for poll in polls:
            poll.close()
    lags = sorted(
        (s.event_ns - produced_ns) / 1e6 for s in reader.streams.values() if s.event_ns and not s.wrong
    )
    wrong = sum(1 for s in reader.streams.values() if s.wrong)
    return SseFanoutResult(
        streams=n,
        opened=reader.opened,
        open_s=open_s,
        rss_per_stream_bytes=(rss1 - rss0) / max(reader.opened, 1),
        idle_cpu_pct=idle_cpu_pct,
        event_first_ms=lags[0] if lags else float("nan"),
        event_p50_ms=percentile(lags, 0.50),
        event_p99_ms=percentile(lags, 0.99),
        event_max_ms=lags[-1] if lags else float("nan"),
        event_cpu_us=1e6 * event_cpu_s / max(len(lags), 1),
        received=len(lags),
        wrong=wrong,
        load_average=os.getloadavg(),
        burst_healthz_ms=probe.healthz_ms,
        burst_produce_ms=probe.produce_ms,
    )


def run_sse_case(
    bootstrap: str,
    streams: int,
    *,
    idle_s: float,
    timeout_s: float,
    server_args: tuple[str, ...] = (),
    service_python: str | None = None,
    server: str = "serve",
) -> SseFanoutResult:
    """One run on a fresh topic and a fresh service process (module docstring)."""
    topic = _create_topic(bootstrap, 1)
    probe_topic = _create_topic(bootstrap, 1)  # the burst probe's produces: never the streams' topic
    producer = _written_with(bootstrap, topic, 1)
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(CLIENT_GC_THRESHOLD0, *thresholds[1:])
    env = {"PURGATORY_SERVICE__STREAM_HEARTBEAT_MS": str(HEARTBEAT_OFF_MS)}
    service = ServiceProcess(bootstrap, free_port(), server_args, service_python, server, env)
    try:
        service.wait_ready()
        _warm_up(service, topic, 1)
        return asyncio.run(_case(service, producer, topic, streams, idle_s, timeout_s, probe_topic))
    finally:
        service.stop()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        _delete_topic(bootstrap, topic)
        _delete_topic(bootstrap, probe_topic)


def sse_median(runs: list[SseFanoutResult]) -> SseFanoutResult:
    """Per-figure medians (counts: the worst run's)."""

    def med(name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in runs))

    return SseFanoutResult(
        streams=runs[0].streams,
        opened=min(r.opened for r in runs),
        open_s=med("open_s"),
        rss_per_stream_bytes=med("rss_per_stream_bytes"),
        idle_cpu_pct=med("idle_cpu_pct"),
        event_first_ms=med("event_first_ms"),
        event_p50_ms=med("event_p50_ms"),
        event_p99_ms=med("event_p99_ms"),
        event_max_ms=med("event_max_ms"),
        event_cpu_us=med("event_cpu_us"),
        received=min(r.received for r in runs),
        wrong=max(r.wrong for r in runs),
        load_average=runs[-1].load_average,
        burst_healthz_ms=med("burst_healthz_ms"),
        burst_produce_ms=med("burst_produce_ms"),
    )


SSE_HEADER = (
    f"{'':9}{'streams':>8} {'opened':>7} {'open s':>7} {'B/stream':>8} {'idle CPU':>8} "
    f"{'first':>8} {'p50':>8} {'p99':>8} {'max':>8} {'CPU/ev':>7} {'events':>7} {'wrong':>6} "
    f"{'healthz':>8} {'produce':>8}  load"
)


def sse_row(r: SseFanoutResult) -> str:
    return (
        f"{r.streams:>8} {r.opened:>7} {r.open_s:>7.1f} {r.rss_per_stream_bytes:>8.0f} "
        f"{r.idle_cpu_pct:>7.1f}% {r.event_first_ms:>6.1f}ms {r.event_p50_ms:>6.1f}ms "
        f"{r.event_p99_ms:>6.1f}ms {r.event_max_ms:>6.1f}ms "
        f"{r.event_cpu_us:>5.1f}µs {r.received:>7} {r.wrong:>6} "
        f"{r.burst_healthz_ms:>6.1f}ms {r.burst_produce_ms:>6.1f}ms  "
        + " ".join(f"{x:.2f}" for x in r.load_average)
    )


def sse_missed(r: SseFanoutResult) -> list[str]:
    missed = []
    if r.received < r.streams or r.wrong:
        missed.append(f"{r.received} of {r.streams} streams got their event ({r.wrong} wrong or closed)")
    if r.rss_per_stream_bytes > TARGET_BYTES_PER_STREAM:
        missed.append(f"{r.rss_per_stream_bytes:.0f} B/stream > {TARGET_BYTES_PER_STREAM}")
    if r.streams >= 10_000 and not r.event_p99_ms <= TARGET_SSE_P99_MS:
        missed.append(f"p99 {r.event_p99_ms:.1f} ms > {TARGET_SSE_P99_MS} ms")
    if not (r.burst_healthz_ms <= TARGET_BURST_MS and r.burst_produce_ms <= TARGET_BURST_MS):
        missed.append(
            f"/healthz {r.burst_healthz_ms:.1f} ms, produce {r.burst_produce_ms:.1f} ms at the burst "
            f"(<= {TARGET_BURST_MS} ms each)"
        )
    return missed


def fanout_sse(
    counts: list[int],
    idle_s: float,
    repeats: int,
    case_timeout: float,
    server: str,
    server_arg: list[str] | None,
    service_python: str | None,
    out: Path,
) -> None:
    """``purgatory bench fanout --sse`` (module docstring): medians of ``repeats`` runs per count."""
    from .fanout import FD_HEADROOM, _raise_fd_limit

    fds = _raise_fd_limit(2 * max(counts) + FD_HEADROOM)
    counts = [min(c, fds - FD_HEADROOM) for c in counts]
    results: list[SseFanoutResult] = []
    runs_all: list[SseFanoutResult] = []
    with provide_cluster(load_settings().kafka) as cluster:
        typer.echo(
            f"Kafka via {cluster.provider} at {cluster.bootstrap_servers}; service: one process ({server}); "
            f"event streams on one partition; {repeats} run(s), medians; load average {os.getloadavg()}"
        )
        typer.echo(SSE_HEADER)
        for count in counts:
            runs = [
                run_sse_case(
                    cluster.bootstrap_servers,
                    count,
                    idle_s=idle_s,
                    timeout_s=case_timeout,
                    server_args=tuple(server_arg or ()),
                    service_python=service_python,
                    server=server,
                )
                for _ in range(repeats)
            ]
            for i, run in enumerate(runs, 1):
                typer.echo(f"  run {i}: " + sse_row(run))
            result = sse_median(runs)
            typer.echo(f"  median: {sse_row(result)}")
            results.append(result)
            runs_all.extend(runs)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fanout-sse-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(
        json.dumps({"medians": [asdict(r) for r in results], "runs": [asdict(r) for r in runs_all]})
    )
    missed = [f"N={r.streams}: {m}" for r in results for m in sse_missed(r)]
    typer.echo(f"targets missed: {'; '.join(missed)}" if missed else "all targets met")
    typer.echo(f"results: {path}")
