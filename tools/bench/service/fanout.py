"""``purgatory bench fanout``: how many idle long polls one service process holds, and at what cost.

Set-up per case (N waiters on P partitions): a real local Kafka (the project's launcher, or the
cluster named by ``PURGATORY_KAFKA_BOOTSTRAP``), a fresh topic of P partitions, and the example
service under uvicorn **in its own process** on 127.0.0.1 (started fresh for each case, so its
RSS growth is the waiters'). The client is this process: one raw HTTP/1.1 connection per long
poll (``GET .../records?offset=0&max_wait_ms=W``, waiter ``i`` on partition ``i % P``), its answers
read by one epoll thread (:mod:`.h1_client`); or, with ``--http2``, h2c connections of
``--streams-per-connection`` streams each, read by a minimal HTTP/2 frame reader on asyncio
(:mod:`.h2_client`: ~2-3 µs of client CPU per answer, where the ``h2`` library's client
took ~61-67 µs and so set the p99 itself).

Figures:

* registration rate: N / (first connect → the fetch purgatory's ``NumDelayedOperations`` = N);
* RSS per waiter: the service's RSS growth from a warmed-up idle state to N registered, / N;
* idle CPU: the service's user+system CPU over ``--idle-s`` seconds with N waiting, in % of a core;
* produce → answer: one record appended to each partition (``acks=1``), then the time from that
  partition's produce call to each of its long polls' answers (p50 / p99 / max). The long polls
  wait at the end of a partition written before, as a service's do: the producer is made, and
  has appended one record to each partition (acknowledged), before the waiters register at
  offset 1. A producer made at the produce call paid its bootstrap (connection, ApiVersion,
  metadata), and the broker its first append to a fresh partition, inside every answer's time:
  the acknowledgement took 19-25 ms that way, 2-4 ms on a written partition with a warm producer;
* produce → first answer: Kafka's and the change feed's part, which every answer pays once;
* CPU per answer: the service's CPU from the produce to the last answer, / answers (on a shared
  machine the answer times move with the load, this figure much less), and of it the event-loop
  thread's (``loop/ans``: rendering and writing the answers; the rest is the feed's thread
  completing the operations, and the Kafka clients');
* completed vs expired: every answer's ``outcome``; an EXPIRED one is an unexpected expiry
  (``max_wait_ms`` is far longer than the case), a non-200 one an error.

Every wait is bounded (``--case-timeout``) and the service is stopped by its PID (SIGTERM, then
SIGKILL) whatever happens. The machine may be shared: the load average is printed with each case.
Targets (2 cores, client and service sharing them): N = 50,000 held with 0 unexpected expiries,
<= 4 KB per HTTP/1.1 waiter and <= 2 KB per HTTP/2 one, idle CPU <= 2 % of a core, p99 <= 50 ms
(HTTP/2) and <= 150 ms (HTTP/1.1) for 10,000 waiters on one partition, a ``/healthz`` and a
produce sent as the burst begins answered within 100 ms each. ``--client node`` runs the same case with
Node's own HTTP stacks (:mod:`.node_client`), ``--client h2load`` with nghttp2's load generator
(:mod:`.h2load_client`), so the figures do not rest on our clients' shortcuts.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import resource
import statistics
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import Producer
from purgatory.adapters.kafka import provide_cluster
from purgatory.adapters.kafka.local import free_port

from purgatory.settings import load_settings

from ..measure import ChildServer, cpu_seconds, percentile, rss_bytes
from .burst_probe import BurstProbe
from .foreign_client import ForeignLongPolls, ForeignPoll
from .h1_client import AnswerReader, H1LongPoll, open_long_polls
from .h2_client import H2LongPoll, open_h2_long_polls
from .h2load_client import H2loadLongPolls
from .node_client import NodeLongPolls

__all__ = ["FanoutResult", "fanout", "long_polls_waiting", "run_case"]

MAX_WAIT_MS = 60_000  # the service's limit: nothing may expire while a case runs
WAIT_AT = 1  # the long polls' offset: the end of each partition, one record written before
SERVICE_START_TIMEOUT_S = 60.0
SERVICE_STOP_TIMEOUT_S = 20.0
HEALTH_POLL_S = 0.1
FD_HEADROOM = 2_000
CLIENT_GC_THRESHOLD0 = (
    50_000  # as the service's admission.gc_thresholds  # sockets of Kafka clients, files, the health checks
)
TARGET_N = 50_000
TARGET_BYTES_PER_WAITER = 4096
TARGET_BYTES_PER_H2_WAITER = 2048  # an HTTP/2 stream (issue 30)
TARGET_IDLE_CPU_PCT = 2.0  # issue 30
TARGET_BURST_MS = 100.0  # a /healthz and a produce sent as a burst begins (issue 30)
TARGET_P99_MS = 50.0  # over HTTP/2 (issue 30)
TARGET_P99_H1_MS = 150.0  # over HTTP/1.1, one connection per long poll (issue 30)
TARGET_P99_AT = (10_000, 1)  # (waiters, partitions) the p99 target applies to


@dataclass(frozen=True)
class FanoutResult:
    waiters: int
    partitions: int
    registered: int
    register_s: float
    register_per_s: float
    rss_per_waiter_bytes: float
    idle_cpu_pct: float
    answer_p50_ms: float
    answer_p99_ms: float
    answer_max_ms: float
    answer_cpu_us: float
    completed: int
    expired: int
    errors: int
    load_average: tuple[float, float, float]
    task_free: int = 0  # of the registered, how many the protocol-level path holds (no task)
    http2_streams: int = 0  # long polls per h2c connection (0: HTTP/1.1, one connection each)
    client_cpu_us: float = 0.0  # this (client) process's CPU from the produce to the last answer, / answers
    # Of answer_cpu_us, the service's event-loop (main) thread's: the answers' writes; the rest is
    # the other threads' (the feed's tail completing the operations, Kafka clients).
    answer_loop_cpu_us: float = 0.0
    answer_first_ms: float = 0.0  # produce -> the first answer: Kafka's and the feed's part of every answer
    # A /healthz and a produce sent as the burst of answers begins (BurstProbe): send -> answered.
    burst_healthz_ms: float = float("nan")
    burst_produce_ms: float = float("nan")
    client: str = "ours"  # who sent and read the long polls: ours (h1_client, h2_client), node or h2load


def _raise_fd_limit(needed: int) -> int:
    """Raise RLIMIT_NOFILE for this process and its children (the service); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, max(hard, needed)))  # root may raise hard
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _http_json(url: str, timeout_s: float = 30.0) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # loopback only
        return dict(json.loads(response.read()))


def long_polls_waiting(health: Mapping[str, object]) -> int:
    """The long polls waiting, from a ``/healthz`` answer: its ``long_poll_waiters`` (equal long polls
    share one operation, issue 30), else (an older service) the fetch purgatory's operations."""
    waiters = health.get("long_poll_waiters")
    if isinstance(waiters, int):
        return waiters
    purgatories = health["purgatories"]
    assert isinstance(purgatories, dict)
    return int(purgatories["fetch"]["NumDelayedOperations"])


# uvicorn's --http takes an import string of a protocol class: the service's fast paths.
LONG_POLL_HTTP = "purgatory.adapters.service:LongPollHttp"


class ServiceProcess(ChildServer):
    """The example service under uvicorn in a child process; stopped by its PID."""

    def __init__(
        self,
        bootstrap: str,
        port: int,
        server_args: tuple[str, ...] = (),
        python: str | None = None,
        server: str = "serve",
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = {
            **os.environ,
            "PURGATORY_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "PURGATORY_LOG__LEVEL": "WARNING",
            # Waiters must not be answered by the 30 s default clamp while the case runs.
            "PURGATORY_ADMISSION__MAX_WAIT_MS": str(MAX_WAIT_MS),
            "PURGATORY_KAFKA__FEED_MODE": os.environ.get("PURGATORY_KAFKA__FEED_MODE", "push"),
            **(env or {}),
        }
        if server == "serve":  # as deployed: uvicorn shaped by the service.* settings (its protocol too)
            command = [
                python or sys.executable, "-m", "purgatory.adapters.service.serve",
                "--host", "127.0.0.1", "--port", str(port), "--backlog", "4096", *server_args,
            ]  # fmt: skip
        else:  # uvicorn's command line: its own protocols, or the service's (uvicorn-fast: --http)
            fast = ("--http", LONG_POLL_HTTP) if server == "uvicorn-fast" else ()
            command = [
                python or sys.executable, "-m", "uvicorn",
                "--factory", "purgatory.adapters.service:create_app",
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                "--backlog", "4096", "--no-access-log", *fast, *server_args,
            ]  # fmt: skip
        super().__init__(command, env, port, stop_timeout_s=SERVICE_STOP_TIMEOUT_S)

    def wait_ready(self, timeout_s: float = SERVICE_START_TIMEOUT_S, poll_s: float = HEALTH_POLL_S) -> None:
        super().wait_ready(timeout_s, poll_s)

    def pending_fetches(self, timeout_s: float = 30.0) -> int:
        return long_polls_waiting(_http_json(f"{self.url}/healthz", timeout_s))

    def task_free_long_polls(self) -> int:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:  # loopback only
            for line in response.read().decode().splitlines():
                if line.startswith("purgatory_service_task_free_long_polls_total "):
                    return int(float(line.split()[1]))
        return 0


@contextmanager
def _service(
    bootstrap: str, server_args: tuple[str, ...], python: str | None = None, server: str = "serve"
) -> Iterator[ServiceProcess]:
    service = ServiceProcess(bootstrap, free_port(), server_args, python, server)
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


def _create_topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"fanout-{partitions}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=30).values():
        future.result(timeout=30)
    return topic


def _written_with(bootstrap: str, topic: str, partitions: int) -> Producer:
    """A producer connected to every broker that has appended one record to each partition of
    ``topic`` (acknowledged): the long polls wait at offset :data:`WAIT_AT` (module docstring)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 0,
            "log_level": 0,
            "enable.sparse.connections": False,  # connections to every broker, not on first use
        }
    )
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(str(error))

    for partition in range(partitions):
        producer.produce(topic, b"written-before", partition=partition, on_delivery=delivered)
    if producer.flush(30) or failed:
        raise RuntimeError(f"the warm-up records of {topic} were not acknowledged: {failed}")
    return producer


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic], request_timeout=30).values():
        future.result(timeout=30)


def _warm_up(service: ServiceProcess, topic: str, partitions: int) -> None:
    """One answered long poll per partition: metadata cached, feed and clients built, then idle."""
    for partition in range(partitions):
        _http_json(f"{service.url}/topics/{topic}/partitions/{partition}/records?offset=0&max_wait_ms=0", 30)


async def _run_case_async(
    service: ServiceProcess,
    producer: Producer,
    topic: str,
    waiters: int,
    partitions: int,
    idle_s: float,
    timeout_s: float,
    http2_streams: int = 0,
    connection_close: bool = False,
    probe_topic: str | None = None,
    client: str = "ours",
) -> FanoutResult:
    port = int(service.url.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout_s
    rss0 = rss_bytes(service.pid)
    started = time.monotonic()
    polls: list[H1LongPoll] | list[H2LongPoll] | list[ForeignPoll]
    reader: AnswerReader | ForeignLongPolls | None = None
    if client in FOREIGN_CLIENTS:
        foreign = FOREIGN_CLIENTS[client](
            port, topic, waiters, partitions, MAX_WAIT_MS, offset=WAIT_AT, http2_streams=http2_streams,
            timeout_s=timeout_s,
        )  # fmt: skip
        reader, polls = foreign, foreign.polls
        await asyncio.to_thread(foreign.wait_opened)
    elif http2_streams:
        polls = await open_h2_long_polls(
            port, topic, waiters, partitions, MAX_WAIT_MS, http2_streams, offset=WAIT_AT
        )
    else:
        polls = await open_long_polls(
            port, topic, waiters, partitions, MAX_WAIT_MS, offset=WAIT_AT, connection_close=connection_close
        )
        reader = AnswerReader(polls, deadline)  # reads every answer on its own thread
        reader.start()
    try:
        return await _measure_case(
            service, producer, topic, waiters, partitions, idle_s, deadline, started, rss0, polls, reader,
            http2_streams, probe_topic or topic,
        )  # fmt: skip
    finally:
        if reader is not None:
            reader.stop()  # Node's: stopped by its PID
            if isinstance(reader, AnswerReader):
                await asyncio.to_thread(reader.join)
        for poll in polls:
            poll.close()


async def _measure_case(
    service: ServiceProcess,
    producer: Producer,
    topic: str,
    waiters: int,
    partitions: int,
    idle_s: float,
    deadline: float,
    started: float,
    rss0: int,
    polls: list[H1LongPoll] | list[H2LongPoll] | list[ForeignPoll],
    reader: AnswerReader | ForeignLongPolls | None,
    http2_streams: int,
    probe_topic: str,
) -> FanoutResult:
    registered = 0
    while time.monotonic() < deadline:
        try:
            left = max(HEALTH_POLL_S, deadline - time.monotonic())
            registered = await asyncio.to_thread(service.pending_fetches, min(30.0, left))
        except OSError:  # a timeout included: a service busy registering (shared cores), asked again
            continue  # until the case's deadline; a case cut short says so in its counts
        if registered >= waiters or any(p.answered_ns for p in polls):
            break
        await asyncio.sleep(HEALTH_POLL_S)
    register_s = time.monotonic() - started
    rss1 = rss_bytes(service.pid)
    task_free = await asyncio.to_thread(service.task_free_long_polls)
    cpu0, t0 = cpu_seconds(service.pid), time.monotonic()
    await asyncio.sleep(idle_s)
    idle_cpu_pct = 100.0 * (cpu_seconds(service.pid) - cpu0) / (time.monotonic() - t0)
    produced_ns: dict[int, int] = {}
    # Sends a /healthz and a produce as the first answers arrive (issue 30: answered within 100 ms).
    port = int(service.url.rsplit(":", 1)[1])
    foreign = reader if isinstance(reader, ForeignLongPolls) else None
    # A foreign client's answers reach this process only at its end: the probe watches its
    # first answer (Node reports it; h2load's is marked at the produce: ForeignLongPolls.produced).
    watched = [foreign.first] if foreign is not None else polls
    probe = BurstProbe(port, probe_topic, watched, max(1.0, deadline - time.monotonic()))
    probe.start()
    cpu_before_produce = cpu_seconds(service.pid)
    loop_cpu_before_produce = cpu_seconds(service.pid, service.pid)
    client_cpu_before = foreign.client_cpu_s() if foreign is not None else time.process_time()
    for partition in range(partitions):
        produced_ns[partition] = time.monotonic_ns()
        producer.produce(topic, b"fanout", partition=partition)
    producer.poll(0)
    producer.flush(10)
    if foreign is not None:
        foreign.produced()
    if reader is not None:
        await asyncio.to_thread(reader.join)  # every answer read, or the deadline passed
    while time.monotonic() < deadline and not all(p.answered_ns for p in polls):
        await asyncio.sleep(0.05)
    # The service's CPU per answer from the produce to the last answer: unlike the answer times,
    # it hardly depends on what else the (shared) machine runs.
    answer_cpu_s = cpu_seconds(service.pid) - cpu_before_produce
    answer_loop_cpu_s = cpu_seconds(service.pid, service.pid) - loop_cpu_before_produce
    # ... and the client's: reading 50,000 answers shares the same two cores.
    client_cpu_s = (foreign.cpu_s if foreign is not None else time.process_time()) - client_cpu_before
    await asyncio.to_thread(probe.join)
    if foreign is not None and foreign.errors:
        print(f"note: the {foreign.name} client's own errors: {foreign.errors}", file=sys.stderr)
    lags: list[float] = []
    completed = expired = errors = 0
    for poll in polls:
        if poll.status != 200:
            errors += 1
            continue
        outcome = json.loads(poll.body).get("outcome")
        if outcome == "COMPLETED":
            completed += 1
            lags.append((poll.answered_ns - produced_ns[poll.partition]) / 1e6)
        else:
            expired += 1
    lags.sort()
    return FanoutResult(
        waiters=waiters,
        partitions=partitions,
        registered=registered,
        register_s=register_s,
        register_per_s=registered / register_s if register_s > 0 else float("nan"),
        rss_per_waiter_bytes=(rss1 - rss0) / max(registered, 1),
        idle_cpu_pct=idle_cpu_pct,
        answer_p50_ms=percentile(lags, 0.50),
        answer_p99_ms=percentile(lags, 0.99),
        answer_max_ms=lags[-1] if lags else float("nan"),
        answer_cpu_us=1e6 * answer_cpu_s / max(completed, 1),
        completed=completed,
        expired=expired,
        errors=errors,
        load_average=os.getloadavg(),
        task_free=task_free,
        http2_streams=http2_streams,
        client_cpu_us=1e6 * client_cpu_s / max(completed, 1),
        answer_loop_cpu_us=1e6 * answer_loop_cpu_s / max(completed, 1),
        answer_first_ms=lags[0] if lags else float("nan"),
        burst_healthz_ms=probe.healthz_ms,
        burst_produce_ms=probe.produce_ms,
        client=foreign.name if foreign is not None else "ours",
    )


# The clients that are not ours (the bench runs each where its program is on PATH).
FOREIGN_CLIENTS: dict[str, type[NodeLongPolls] | type[H2loadLongPolls]] = {
    client.name: client for client in (NodeLongPolls, H2loadLongPolls)
}


def run_case(
    bootstrap: str,
    waiters: int,
    partitions: int,
    *,
    idle_s: float,
    timeout_s: float,
    server_args: tuple[str, ...] = (),
    service_python: str | None = None,
    server: str = "serve",
    http2_streams: int = 0,
    connection_close: bool = False,
    client: str = "ours",
) -> FanoutResult:
    """One case on a fresh topic and a fresh service process (see the module docstring)."""
    topic = _create_topic(bootstrap, partitions)
    probe_topic = _create_topic(bootstrap, 1)  # the burst probe's produces: never the waiters' topic
    producer = _written_with(bootstrap, topic, partitions)
    thresholds = gc.get_threshold()
    # The client holds N connections too: its own collector must not be what limits registration.
    gc.freeze()
    gc.set_threshold(CLIENT_GC_THRESHOLD0, *thresholds[1:])
    try:
        with _service(bootstrap, server_args, service_python, server) as service:
            _warm_up(service, topic, partitions)
            case = _run_case_async(
                service,
                producer,
                topic,
                waiters,
                partitions,
                idle_s,
                timeout_s,
                http2_streams,
                connection_close,
                probe_topic,
                client,
            )
            return asyncio.run(case)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        _delete_topic(bootstrap, topic)
        _delete_topic(bootstrap, probe_topic)


def _median(runs: list[FanoutResult]) -> FanoutResult:
    """Per-figure medians over the runs (counts: the worst run's, so a failure is never hidden)."""
    return FanoutResult(
        waiters=runs[0].waiters,
        partitions=runs[0].partitions,
        registered=min(r.registered for r in runs),
        register_s=statistics.median(r.register_s for r in runs),
        register_per_s=statistics.median(r.register_per_s for r in runs),
        rss_per_waiter_bytes=statistics.median(r.rss_per_waiter_bytes for r in runs),
        idle_cpu_pct=statistics.median(r.idle_cpu_pct for r in runs),
        answer_p50_ms=statistics.median(r.answer_p50_ms for r in runs),
        answer_p99_ms=statistics.median(r.answer_p99_ms for r in runs),
        answer_max_ms=statistics.median(r.answer_max_ms for r in runs),
        answer_cpu_us=statistics.median(r.answer_cpu_us for r in runs),
        completed=min(r.completed for r in runs),
        expired=max(r.expired for r in runs),
        errors=max(r.errors for r in runs),
        load_average=runs[-1].load_average,
        task_free=min(r.task_free for r in runs),
        http2_streams=runs[0].http2_streams,
        client_cpu_us=statistics.median(r.client_cpu_us for r in runs),
        answer_loop_cpu_us=statistics.median(r.answer_loop_cpu_us for r in runs),
        answer_first_ms=statistics.median(r.answer_first_ms for r in runs),
        burst_healthz_ms=statistics.median(r.burst_healthz_ms for r in runs),
        burst_produce_ms=statistics.median(r.burst_produce_ms for r in runs),
        client=runs[0].client,
    )


def _row(result: FanoutResult) -> str:
    return (
        f"{result.waiters:>8} {result.partitions:>5} {result.register_per_s:>8.0f} "
        f"{result.rss_per_waiter_bytes:>8.0f} {result.idle_cpu_pct:>7.1f}% "
        f"{result.answer_first_ms:>6.1f}ms {result.answer_p50_ms:>6.1f}ms {result.answer_p99_ms:>6.1f}ms "
        f"{result.answer_max_ms:>6.1f}ms {result.answer_cpu_us:>6.0f}µs {result.answer_loop_cpu_us:>6.1f}µs "
        f"{result.completed:>7} {result.expired:>7} {result.errors:>6} {result.task_free:>7} "
        f"{result.client_cpu_us:>6.0f}µs "
        f"{result.burst_healthz_ms:>6.1f}ms {result.burst_produce_ms:>6.1f}ms  "
        + " ".join(f"{x:.2f}" for x in result.load_average)
    )


def _missed(result: FanoutResult) -> list[str]:
    missed = []
    if result.expired or result.errors or result.registered < result.waiters:  # every case: 0 expected
        missed.append(
            f"{result.waiters} held without expiry ({result.expired} expired, {result.errors} errors)"
        )
    per_waiter = TARGET_BYTES_PER_H2_WAITER if result.http2_streams else TARGET_BYTES_PER_WAITER
    if result.rss_per_waiter_bytes > per_waiter:
        missed.append(f"{result.rss_per_waiter_bytes:.0f} B/waiter > {per_waiter}")
    if result.idle_cpu_pct > TARGET_IDLE_CPU_PCT:
        missed.append(f"idle CPU {result.idle_cpu_pct:.1f}% > {TARGET_IDLE_CPU_PCT}%")
    target = TARGET_P99_MS if result.http2_streams else TARGET_P99_H1_MS
    if (result.waiters, result.partitions) == TARGET_P99_AT and not result.answer_p99_ms <= target:
        missed.append(f"p99 {result.answer_p99_ms:.1f} ms > {target} ms")
    if not (result.burst_healthz_ms <= TARGET_BURST_MS and result.burst_produce_ms <= TARGET_BURST_MS):
        missed.append(
            f"/healthz {result.burst_healthz_ms:.1f} ms, produce {result.burst_produce_ms:.1f} ms at the "
            f"burst (<= {TARGET_BURST_MS} ms each)"
        )
    return missed


def fanout(
    waiters: Annotated[
        list[int] | None, typer.Option("--waiters", "-n", help="Idle long polls per case; repeatable.")
    ] = None,
    partitions: Annotated[
        list[int] | None, typer.Option("--partitions", "-p", help="Partitions per case; repeatable.")
    ] = None,
    idle: Annotated[float, typer.Option("--idle-s", help="Seconds of idle CPU measured.")] = 10.0,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1, help="Runs per case (medians).")] = 3,
    case_timeout: Annotated[float, typer.Option(help="Bound on one case, seconds.")] = 55.0,
    server: Annotated[
        str,
        typer.Option(
            "--server",
            help="serve: python -m purgatory.adapters.service.serve (as deployed; PURGATORY_SERVICE__"
            "FAST_LONG_POLL=false turns the protocol-level long poll off); uvicorn: uvicorn's command line "
            f"(its own protocols); uvicorn-fast: uvicorn's command line with --http {LONG_POLL_HTTP}.",
        ),
    ] = "serve",
    server_arg: Annotated[
        list[str] | None,
        typer.Option("--server-arg", help="Extra argument of the server's command line; repeatable."),
    ] = None,
    service_python: Annotated[
        str | None,
        typer.Option(
            "--service-python",
            help="Interpreter that runs the service (another build's venv: compare builds, same client).",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Directory of the JSON result file.")] = Path(
        "bench-results"
    ),
    http2: Annotated[
        bool,
        typer.Option(
            "--http2",
            help="Long polls as HTTP/2 streams (h2c, prior knowledge; the h2 library's client), "
            "--streams-per-connection on each connection, instead of one HTTP/1.1 connection each.",
        ),
    ] = False,
    streams_per_connection: Annotated[
        int, typer.Option("--streams-per-connection", min=1, help="Long polls per h2c connection (--http2).")
    ] = 1000,
    connection_close: Annotated[
        bool,
        typer.Option(
            "--connection-close",
            help="HTTP/1.1 long polls that send Connection: close (the service closes after each answer).",
        ),
    ] = False,
    clients: Annotated[
        list[str] | None,
        typer.Option(
            "--client",
            help="Who sends and reads the long polls: ours (the bench's raw-socket and frame-reader "
            "clients), node (Node's own http/http2 stacks, node_client.py) or h2load (nghttp2's load "
            "generator, h2load_client.py); repeatable. Default: ours and each other one on PATH.",
        ),
    ] = None,
    sse: Annotated[
        bool,
        typer.Option(
            "--sse",
            help="Event streams (GET .../stream, Server-Sent Events) on one partition instead of long "
            "polls: RSS per stream, produce→event (fanout_sse.py). -n as for long polls; -p is 1.",
        ),
    ] = False,
) -> None:
    """N idle long polls on one service process: registration rate, RSS/waiter, idle CPU, produce→answer."""
    if sse:
        from .fanout_sse import fanout_sse  # its own figures and table

        fanout_sse(waiters or [10_000], idle, repeats, case_timeout, server, server_arg, service_python, out)
        return
    if clients is None:
        clients = ["ours", *(name for name, client in FOREIGN_CLIENTS.items() if client.available())]
    for client in clients:
        if client != "ours" and client not in FOREIGN_CLIENTS:
            raise typer.BadParameter(
                f"--client must be ours, node or h2load, got {client!r}", param_hint="--client"
            )
        if client in FOREIGN_CLIENTS and not FOREIGN_CLIENTS[client].available():
            raise typer.BadParameter(f"--client {client} needs {client} on PATH", param_hint="--client")
    if server not in ("serve", "uvicorn", "uvicorn-fast"):
        raise typer.BadParameter(
            f"--server must be serve, uvicorn or uvicorn-fast, got {server!r}", param_hint="--server"
        )
    counts = waiters or [10_000, TARGET_N]
    partition_counts = partitions or [1, 8]
    sockets = -(-max(counts) // streams_per_connection) if http2 else max(counts)
    fds = _raise_fd_limit(2 * sockets + FD_HEADROOM)
    # Each waiter is one socket in this process and one in the service: the open-file limit (its
    # hard limit can only be raised with CAP_SYS_RESOURCE) caps N. Capped cases say so.
    cap = fds - FD_HEADROOM
    if cap <= 0:
        raise typer.BadParameter(f"open-file limit {fds} leaves no room for connections", param_hint="-n")
    if http2:  # the cap is on connections: streams_per_connection waiters each
        cap *= streams_per_connection
    if max(counts) > cap:
        typer.echo(f"note: open-file limit {fds}: cases above {cap} waiters are capped to {cap}")
    counts = list(dict.fromkeys(min(c, cap) for c in counts))
    settings = load_settings().kafka
    results: list[FanoutResult] = []
    all_runs: list[FanoutResult] = []
    with provide_cluster(settings) as cluster:
        typer.echo(
            f"Kafka via {cluster.provider} at {cluster.bootstrap_servers}; service: one process ({server}, "
            f"fast_long_poll={load_settings().service.fast_long_poll if server != 'uvicorn' else False}); "
            f"{repeats} run(s) per case, medians; load average {os.getloadavg()}; "
            + (f"HTTP/2 (h2c), {streams_per_connection} streams per connection" if http2 else "HTTP/1.1")
            + (", Connection: close" if connection_close and not http2 else "")
        )
        typer.echo(
            f"{'':11}{'waiters':>8} {'parts':>5} {'reg/s':>8} {'B/waiter':>8} {'idle CPU':>8} "
            f"{'first':>8} {'p50':>8} {'p99':>8} {'max':>8} {'CPU/ans':>8} {'loop/ans':>8} "
            f"{'done':>7} {'expired':>7} {'errors':>6} "
            f"{'no-task':>7} {'cli/ans':>8} {'healthz':>8} {'produce':>8}  load"
        )
        for count, parts, client in itertools.product(counts, partition_counts, clients):
            if client == "h2load" and parts > 1 and not http2:
                typer.echo(f"  note: h2load skipped for {parts} partitions (HTTP/1.1: one partition only)")
                continue
            runs = [
                run_case(
                    cluster.bootstrap_servers,
                    count,
                    parts,
                    idle_s=idle,
                    timeout_s=case_timeout,
                    server_args=tuple(server_arg or ()),
                    service_python=service_python,
                    server=server,
                    http2_streams=streams_per_connection if http2 else 0,
                    connection_close=connection_close,
                    client=client,
                )
                for _ in range(repeats)
            ]
            result = _median(runs)
            results.append(result)
            all_runs.extend(runs)
            for i, run in enumerate(runs, 1):
                typer.echo(f"  {client:<6} {i}: " + _row(run))
            typer.echo(f"  {client:<6} md: {_row(result)}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fanout-{time.strftime('%Y%m%dT%H%M%S')}.json"
    document = {"medians": [asdict(r) for r in results], "runs": [asdict(r) for r in all_runs]}
    path.write_text(json.dumps(document, indent=2))
    missed = [f"N={r.waiters}/P={r.partitions} ({r.client}): {m}" for r in results for m in _missed(r)]
    if not any(r.waiters >= TARGET_N for r in results):
        missed.append(f"N={TARGET_N} not measured (at most {max(counts)} waiters ran)")
    typer.echo(f"targets missed: {'; '.join(missed)}" if missed else "all targets met")
    typer.echo(f"results: {path}")
