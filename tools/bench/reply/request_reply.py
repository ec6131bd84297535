"""``purgatory bench request-reply``: round trips of ``kp.request`` on a local Kafka, 1 and 3 brokers.

Workload, per broker count: a local Apache Kafka (the project's launcher, 127.0.0.1, stopped by
PID at the end), a request topic (1 partition) and a reply topic (2 partitions), replication
factor = brokers (``min.insync.replicas`` 2 with 3 brokers), both created once per cluster with
fixed leaders (``_create_bench_topics``: why) and used by every run of both sides and by the
warm-up. An echo :class:`Responder` runs in a
process of its own (as it would in production; it also keeps its GIL out of the requester's). The
requester sends ``rate`` requests per second, paced on its event loop (open loop: a slow answer
does not slow the sending), for ``warmup`` + ``duration`` seconds, and measures each round trip
from the ``request()`` call to its answer.

Two requesters, alternating which runs first, on the same cluster and responder:

* ``purgatory`` — ``await kp.request(...)``: a DelayedRequest in the purgatory, replies routed by
  the reply router's tail;
* ``hand-rolled`` — the baseline a Python service writes without us: a dict of asyncio futures
  keyed by correlation id, a consumer thread reading the reply partition, ``asyncio.wait_for``
  for the deadline (no duplicate/late accounting, no journal, no N-of-M, no scale-out).

Printed: requests/s achieved, p50/p99/max round trip, timeouts, CPU per request (requester,
responder, brokers, and of the brokers' the JIT compiler threads'), GC pauses, and the median of
the same-run p99 ratios (purgatory ÷ hand-rolled); medians over ``--repeats``.
Target (issue 14): p99 ≤ 20 ms at 1,000 requests/s on this machine.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from purgatory.adapters.kafka import (
    CORRELATION_ID,
    REPLY_PARTITION,
    REPLY_TOPIC,
    KafkaAdapterError,
    KafkaPurgatory,
    LocalKafkaCluster,
    RequestTimeoutError,
    encode_partition,
    header,
    headers_of,
)
from purgatory.adapters.kafka.local import FAST_START_JVM_OPTIONS, STEADY_STATE_JVM_OPTIONS
from purgatory.adapters.kafka.settings import KafkaSettings

from ..kafka.feed import BENCH_HEAP_MB, BENCH_HEAP_OPTIONS
from ..measure import GcMeter, cpu_seconds_of, percentile, stop_child, thread_times

__all__ = ["RunResult", "request_reply", "run_once"]

TARGET_P99_MS = 20.0
TARGET_RATE = 1000.0
PAYLOAD = b"x" * 100  # a small request, as RPC over Kafka usually is
RESPONDER_READY_S = 60.0  # responder process: import, group join, first assignment
STOP_S = 15.0
TOPIC_TIMEOUT_S = 30.0
# The example service's admission.gc_thresholds while it serves (purgatory bench fanout), and the
# interpreter's defaults restored after each run.
SERVICE_GC_THRESHOLDS = (50_000, 20, 100)
DEFAULT_GC_THRESHOLDS = (700, 10, 10)


@dataclass(frozen=True)
class RunResult:
    side: str
    brokers: int
    rate: float
    sent: int
    answered: int
    timeouts: int
    achieved_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    # CPU per request during the paced requests (warm-up included, set-up and close not; _drive)
    cpu_us_per_request: float  # the requester process (this one)
    responder_cpu_us_per_request: float
    brokers_cpu_us_per_request: float
    gc_ms: float  # the requester's cyclic-GC pauses during the run (they stall every thread)
    gc_full: int  # ... of which full (generation 2) collections
    # The brokers' JVM GC pauses during the paced requests (jstat; all nodes summed): each one
    # stops a broker that every round trip passes through (leader or follower).
    broker_gc_pauses: int = 0
    broker_gc_ms: float = 0.0
    # Of brokers_cpu_us_per_request, the brokers' JIT compiler threads (C1, C2): near 0 once the
    # hot paths are compiled; a run that pays the compilation costs the brokers up to twice as much
    # CPU per round trip (docs/performance.md, "The slow first run").
    brokers_jit_cpu_us_per_request: float = 0.0
    # The machine during the run: how late a process sleeping 10 ms woke (its p99 and max). Every
    # round trip is ~10 process wake-ups (requester, brokers, followers, responder): with a run
    # queue this deep, no requester meets a 20 ms p99. Measured by a child process (_WakeProbe).
    wake_p99_ms: float = float("nan")
    wake_max_ms: float = float("nan")


# -- the responder process ---------------------------------------------------------------------


def _responder_main(topic: str, group: str, bootstrap: str, linger_ms: str = "0") -> None:
    """Echo responder (``python -m purgatory.tools.bench.reply.request_reply responder ...``)."""
    from purgatory.adapters.kafka import Request, Responder

    def value_of(request: Request) -> bytes | None:
        value: bytes | None = request.value
        return value

    echo = Responder(topic, value_of, group=group, linger_ms=int(linger_ms))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    echo.start(KafkaSettings(bootstrap_servers=bootstrap))
    if not echo.assigned.wait(RESPONDER_READY_S):
        sys.exit("responder: no partition assigned")
    # A service answering requests freezes its start-up objects once started, as both requesters
    # do (_freeze_start_up). Unfrozen, with the interpreter's thresholds, this echo responder ran
    # 308 collections in ~30 s of 1,000 requests/s, 4 of them full, up to 287 ms each (every reply
    # of either side waited behind it); frozen, 3 besides the freeze's own in the same span.
    _freeze_start_up()
    print("ready", flush=True)
    stopping.wait()
    echo.stop()
    print(json.dumps(asdict(echo.stats)), flush=True)


class _ResponderProcess:
    def __init__(self, topic: str, group: str, bootstrap: str, linger_ms: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, "responder", topic, group, bootstrap, str(linger_ms)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PURGATORY_LOG__LEVEL": "WARNING"},
        )
        ready = threading.Event()
        stdout = self.process.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                if line.strip() == "ready":
                    ready.set()
                    return

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(RESPONDER_READY_S):
            self.stop()
            raise RuntimeError("the responder process did not get its partition in time")

    def stop(self) -> None:
        # Our own child, by PID: SIGTERM (it leaves its group), then SIGKILL if it hangs.
        stop_child(self.process, STOP_S)


# -- the machine's scheduling delay ---------------------------------------------------------------

_WAKE_PROBE = """
import signal, sys, time
late = []
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
while not stop:
    t = time.perf_counter()
    time.sleep(0.01)
    late.append((time.perf_counter() - t - 0.01) * 1000.0)
late = sorted(late) or [-1.0]
print(late[min(len(late) - 1, int(0.99 * len(late)))], late[-1], flush=True)
"""


class _WakeProbe:
    """A child process sleeping 10 ms at a time, reporting how late it woke (p99, max) at the end.

    It runs beside the requester and costs ~100 wake-ups/s; the figures say how deep the run queue
    of the shared machine was during the run (other sessions' work), which round trips pay at
    each process hop.
    """

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WAKE_PROBE], stdout=subprocess.PIPE, text=True
        )
        stdout = self.process.stdout
        assert stdout is not None
        stdout.readline()  # "ready"

    def stop(self) -> tuple[float, float]:
        """(p99, max) lateness in ms; nan if the probe gave none."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = self.process.communicate(timeout=STOP_S)
            p99, worst = (float(x) for x in out.split())
            return p99, worst
        except (subprocess.TimeoutExpired, ValueError):
            self.process.kill()
            self.process.wait(STOP_S)
            return float("nan"), float("nan")


# -- the two requesters ------------------------------------------------------------------------

Send = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class _Cpu:
    """CPU seconds spent during the paced requests: this process, the responder, the brokers."""

    requester: float
    responder: float
    brokers: float
    broker_gc: tuple[int, float] = (0, 0.0)  # the brokers' GC pauses (count, seconds), all nodes
    broker_jit: float = 0.0  # of ``brokers``, the JIT compiler threads'


def _drive(
    gc_meter: GcMeter,
    start: Callable[[], Awaitable[None]],
    request: Callable[[], Awaitable[Any]],
    rate: float,
    warmup_s: float,
    duration_s: float,
    others: tuple[list[int], list[int]] = ([], []),
) -> tuple[list[float], int, int, float, _Cpu]:
    """One side's run on a fresh event loop, alike for both sides: ``start`` (not measured), the
    start-up freeze, then the paced requests; returns ``_paced``'s figures and the CPU of the
    requester, responder (``others[0]``) and brokers (``others[1]``) during the paced requests.

    Only the paced requests are counted: the two sides' set-up and close differ (our requester
    creates its reply topic and starts a tail, the hand-rolled one a consumer), and on the busy
    machine one of our runs took 24 s from connect to close where the hand-rolled one took 11 s:
    the brokers' CPU of those 13 s (topic creation, idle cluster) was counted per request."""

    async def drive() -> tuple[list[float], int, int, float, _Cpu]:
        await start()
        _freeze_start_up()
        gc_meter.reset()  # the freeze's own full collection is start-up, not the run
        gc0 = _broker_gc(others[1])  # jstat is a process of its own: outside the CPU counted
        jit0 = _jit_cpu_s(others[1])
        responder0, brokers0 = cpu_seconds_of(others[0]), cpu_seconds_of(others[1])
        cpu0 = time.process_time()
        figures = await _paced(request, rate, warmup_s, duration_s)
        requester = time.process_time() - cpu0
        responder, brokers = cpu_seconds_of(others[0]) - responder0, cpu_seconds_of(others[1]) - brokers0
        jit = _jit_cpu_s(others[1]) - jit0
        gc1 = _broker_gc(others[1])
        broker_gc = (gc1[0] - gc0[0], gc1[1] - gc0[1])
        return (*figures, _Cpu(requester, responder, brokers, broker_gc, jit))

    with gc_meter:
        return asyncio.run(drive())


async def _paced(
    request: Send, rate: float, warmup_s: float, duration_s: float
) -> tuple[list[float], int, int, float]:
    """Send ``rate``/s for warmup + duration; round trips (s) of the measured part, timeouts, sent."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    timeouts = 0
    total = int((warmup_s + duration_s) * rate)
    first_measured = int(warmup_s * rate)
    tasks: set[asyncio.Task[None]] = set()

    async def one(measured: bool) -> None:
        nonlocal timeouts
        started = time.perf_counter()
        try:
            await request()
        except (RequestTimeoutError, TimeoutError, KafkaAdapterError):
            # Unanswered. KafkaAdapterError: our request's record was not delivered within the
            # sender's bound (a broker stalled for seconds on the loaded machine); the
            # hand-rolled side's request then ends in its wait_for timeout, counted here alike.
            timeouts += 1
            return
        if measured:
            latencies.append(time.perf_counter() - started)

    start = loop.time()
    measured_from = 0.0
    for i in range(total):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if i == first_measured:
            measured_from = loop.time()
        task = asyncio.create_task(one(i >= first_measured))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    sent_window = loop.time() - measured_from
    await asyncio.gather(*tasks)
    return latencies, timeouts, total - first_measured, sent_window


# Kafka client settings the baseline shares with our requester (the comparison is of the
# requesters, not of client tuning): Nagle off on both clients, as our sender and tail run.
HAND_ROLLED_CLIENT = {"socket.nagle.disable": True}


class _HandRolled:
    """The baseline: futures by correlation id, a consumer thread on the reply partition."""

    def __init__(self, bootstrap: str, topic: str, reply_topic: str, linger_ms: int) -> None:
        self.topic, self.reply_topic = topic, reply_topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": linger_ms,
                "enable.idempotence": True,
                **HAND_ROLLED_CLIENT,
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"hand-rolled-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                **HAND_ROLLED_CLIENT,
            }
        )
        self.consumer.assign([TopicPartition(reply_topic, 0, OFFSET_END)])
        self.waiting: dict[bytes, asyncio.Future[bytes | None]] = {}
        self.stopping = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.positioned = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.poller = threading.Thread(target=self._poll, daemon=True)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread.start()
        self.poller.start()
        if not self.positioned.wait(TOPIC_TIMEOUT_S):
            raise RuntimeError("hand-rolled consumer never positioned")

    def _poll(self) -> None:
        while not self.stopping.is_set():
            self.producer.poll(0.05)

    def _run(self) -> None:
        while not self.stopping.is_set():
            message = self.consumer.poll(0.1)
            if not self.positioned.is_set():
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.reply_topic, 0), cached=True
                )
                if high >= 0:
                    self.positioned.set()
            if message is None or message.error() is not None:
                continue
            correlation = header(headers_of(message.headers()), CORRELATION_ID)
            future = self.waiting.pop(correlation or b"", None)
            if future is not None and self.loop is not None:
                self.loop.call_soon_threadsafe(_resolve, future, message.value())

    async def request(self, timeout_s: float) -> bytes | None:
        assert self.loop is not None
        correlation = uuid.uuid4().hex.encode()
        future: asyncio.Future[bytes | None] = self.loop.create_future()
        self.waiting[correlation] = future
        headers = [
            (CORRELATION_ID, correlation),
            (REPLY_TOPIC, self.reply_topic.encode()),
            (REPLY_PARTITION, encode_partition(0)),
        ]
        self.producer.produce(self.topic, PAYLOAD, headers=headers)
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self.waiting.pop(correlation, None)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(STOP_S)
        self.poller.join(STOP_S)
        self.consumer.close()
        self.producer.flush(STOP_S)


def _resolve(future: asyncio.Future[bytes | None], value: bytes | None) -> None:
    if not future.done():
        future.set_result(value)


def _freeze_start_up() -> None:
    # What a service does once started (the example service freezes its start-up objects too):
    # the modules, clients and settings built so far move out of the collector's generations, so a
    # full collection scans only what the run allocates. Without it, a full collection in the
    # middle of a run stalled every thread for 100-1000 ms (the p99 of whichever side it hit).
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVICE_GC_THRESHOLDS)


def _thaw() -> None:
    gc.set_threshold(*DEFAULT_GC_THRESHOLDS)
    gc.unfreeze()


# The names HotSpot gives its JIT compiler threads ("C2 CompilerThread0", "C1 CompilerThread0"),
# as /proc shows them: cut to the kernel's 15 characters.
_JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


def _jit_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the JIT compiler threads of the JVMs ``pids`` so far (a thread
    or process gone counts 0)."""
    return sum(t.cpu_s for pid in pids for t in thread_times(pid) if t.name.startswith(_JIT_THREADS))


def _broker_gc(pids: list[int]) -> tuple[int, float]:
    """GC pauses of the broker JVMs so far, summed: (collections, seconds) from the JDK's jstat
    (young and full); (0, 0.0) where jstat is missing or a JVM is gone."""
    count, seconds = 0, 0.0
    for pid in pids:
        try:
            out = subprocess.run(
                ["jstat", "-gc", str(pid)], capture_output=True, text=True, timeout=STOP_S
            ).stdout.split("\n")
            row = dict(zip(out[0].split(), out[1].split(), strict=False))
            count += int(float(row["YGC"])) + int(float(row["FGC"]))
            seconds += float(row["YGCT"]) + float(row["FGCT"])
        except (OSError, subprocess.TimeoutExpired, IndexError, KeyError, ValueError):
            continue
    return count, seconds


def _collect_broker_heaps(pids: list[int]) -> None:
    """A full GC in each broker JVM (``jcmd <pid> GC.run``), unmeasured, before the first run.

    What the JIT warm-up and start-up left in the young generation (with the bench's 768 MB young
    generation, ~150 MB still reachable per broker) is otherwise copied by the first young
    collection, whichever run it falls in: 277-844 ms per broker at load 18-25 (jstat), where the
    later young collections only copy what the traffic since the previous one left alive.
    """
    for pid in pids:
        try:
            subprocess.run(
                ["jcmd", str(pid), "GC.run"], capture_output=True, timeout=TOPIC_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue


def run_once(
    side: str,
    bootstrap: str,
    topic: str,
    brokers: int,
    *,
    reply_topic: str,
    rate: float,
    warmup_s: float,
    duration_s: float,
    timeout_ms: int,
    linger_ms: int = 0,
    responder_pid: int | None = None,
    broker_pids: tuple[int, ...] = (),
) -> RunResult:
    """One requester side against the running responder of ``topic``, its replies on
    ``reply_topic`` (both sides use the same: ``_create_bench_topics``)."""
    gc_meter = GcMeter()
    others = ([responder_pid] if responder_pid is not None else [], list(broker_pids))
    probe = _WakeProbe()
    try:
        if side == "purgatory":
            kp = KafkaPurgatory.connect(
                KafkaSettings(bootstrap_servers=bootstrap), name="bench", metrics=False
            )
            kp.replies(reply_topic, partitions=2, replication_factor=brokers, linger_ms=linger_ms)
            try:
                aio = kp.aio

                async def start() -> None:
                    await aio.request(topic, PAYLOAD, timeout_ms=30_000)  # starts request-reply, not measured

                latencies, timeouts, sent, window, cpu = _drive(
                    gc_meter,
                    start,
                    lambda: aio.request(topic, PAYLOAD, timeout_ms=timeout_ms),
                    rate,
                    warmup_s,
                    duration_s,
                    others,
                )
            finally:
                _thaw()
                kp.close()
        else:
            baseline = _HandRolled(bootstrap, topic, reply_topic, linger_ms)
            try:

                async def start() -> None:
                    baseline.start(asyncio.get_running_loop())

                latencies, timeouts, sent, window, cpu = _drive(
                    gc_meter,
                    start,
                    lambda: baseline.request(timeout_ms / 1000.0),
                    rate,
                    warmup_s,
                    duration_s,
                    others,
                )
            finally:
                _thaw()
                baseline.close()
    finally:
        wake_p99, wake_max = probe.stop()
    latencies.sort()
    ms = [x * 1000.0 for x in latencies]
    requests = max(1, int((warmup_s + duration_s) * rate))
    return RunResult(
        side=side,
        brokers=brokers,
        rate=rate,
        sent=sent,
        answered=len(ms),
        timeouts=timeouts,
        achieved_per_s=sent / window if window > 0 else float("nan"),
        p50_ms=percentile(ms, 0.50),
        p99_ms=percentile(ms, 0.99),
        max_ms=ms[-1] if ms else float("nan"),
        cpu_us_per_request=cpu.requester / requests * 1e6,
        responder_cpu_us_per_request=cpu.responder / requests * 1e6,
        brokers_cpu_us_per_request=cpu.brokers / requests * 1e6,
        gc_ms=gc_meter.seconds * 1000.0,
        gc_full=gc_meter.counts[2],
        broker_gc_pauses=cpu.broker_gc[0],
        broker_gc_ms=cpu.broker_gc[1] * 1000.0,
        brokers_jit_cpu_us_per_request=cpu.broker_jit / requests * 1e6,
        wake_p99_ms=wake_p99,
        wake_max_ms=wake_max,
    )


REPLY_PARTITIONS = 2  # of the reply topic; both requesters name partition 0 (their home) in requests
# Index (in the sorted broker ids) of the broker leading the request partition; the reply
# topic's partition 0 is led by the next one. With 3 brokers: requests on node 2, replies on
# node 3, and node 1 — the launcher's only controller, which also runs the KRaft quorum — leads
# neither hot partition and follows both.
REQUEST_LEADER_INDEX = 1


@dataclass(frozen=True)
class BenchTopics:
    """The request and reply topics of one cluster, shared by every run of both sides."""

    requests: str
    replies: str


def _placement(broker_ids: list[int], partitions: int, first: int) -> list[list[int]]:
    """Replica lists (all brokers each) whose leaders — the first replica, Kafka's preferred
    leader — are ``broker_ids[first]``, ``broker_ids[first + 1]``, ... in turn (wrapping)."""
    n = len(broker_ids)
    return [[broker_ids[(first + p + i) % n] for i in range(n)] for p in range(partitions)]


def _create_bench_topics(bootstrap: str, brokers: int) -> BenchTopics:
    """The request topic (1 partition) and the reply topic (``REPLY_PARTITIONS``), replicated on
    every broker, each partition's leader fixed (``REQUEST_LEADER_INDEX``).

    Created once per cluster, before the warm-up, for two reasons measured at 3 brokers
    (docs/performance.md, "The slow first run"). A reply topic created per run put its partition
    0 leader on whichever broker Kafka chose: a broker leading it for the first time compiled
    the leader's produce and fetch paths (its C1/C2 threads 1-3.4 s) during the measured run,
    which then cost the brokers up to twice the CPU per round trip of a run on brokers that had
    compiled them already. Used by the warm-up too, every broker's role in a run is the one it
    was warmed up in. And fixed leaders put the same work on the same broker in every
    invocation (a random placement moved the request and reply leaders onto one broker in some).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    ids = sorted(admin.list_topics(timeout=TOPIC_TIMEOUT_S).brokers)
    if len(ids) != brokers:
        raise RuntimeError(f"the cluster names brokers {ids}, expected {brokers}")
    config = {"min.insync.replicas": "2"} if brokers >= 3 else {}
    suffix = uuid.uuid4().hex[:8]
    topics = BenchTopics(f"bench-requests-{suffix}", f"bench-replies-{suffix}")
    placements = {
        topics.requests: _placement(ids, 1, REQUEST_LEADER_INDEX),
        topics.replies: _placement(ids, REPLY_PARTITIONS, REQUEST_LEADER_INDEX + 1),
    }
    # num_partitions must be given with a replica assignment (librdkafka refuses the default -1).
    new = [NewTopic(t, len(a), replica_assignment=a, config=config) for t, a in placements.items()]
    futures = admin.create_topics(new, request_timeout=TOPIC_TIMEOUT_S, operation_timeout=TOPIC_TIMEOUT_S)
    for future in futures.values():
        future.result(timeout=TOPIC_TIMEOUT_S + 1.0)
    return topics


def _leaders(bootstrap: str, topics: BenchTopics) -> str:
    """Leader of the request partition and of each reply partition now: "requests 2, replies 3/1"."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.list_topics(timeout=TOPIC_TIMEOUT_S).topics

    def of(topic: str) -> str:
        partitions = described[topic].partitions if topic in described else {}
        return "/".join(str(partitions[p].leader) for p in sorted(partitions)) or "?"

    return f"requests {of(topics.requests)}, replies {of(topics.replies)}"


def _median(runs: list[RunResult], field: str) -> float:
    return float(statistics.median(getattr(r, field) for r in runs))


# Broker JIT: "full" (C1 then C2, what a production broker runs) or "c1" (the launcher's fast-start
# default for tests). Both requesters share the cluster, so the same-run ratio stays fair.
JVM_PROFILES: dict[str, tuple[str, ...]] = {"full": STEADY_STATE_JVM_OPTIONS, "c1": FAST_START_JVM_OPTIONS}
# The broker heap fixed at its maximum from the start (-Xms = -Xmx), as Kafka's own
# kafka-server-start.sh runs a broker (-Xms1G -Xmx1G), with most of it young: with the launcher's
# -Xms64m the young generation stayed ~20 MB (1-3 pauses per broker per 12 s run); fixed at
# 384 MB it was ~120 MB and each broker still paused for a young collection every 20-45 s of this
# load (-Xlog:gc, 3 brokers, 1,000 round trips/s: ~100 MB of young garbage per broker per 20 s),
# 21-346 ms per pause on the shared machine (load 15-25) — about one pause per run somewhere in
# the cluster, and every round trip passes through all three brokers. A 768 MB young generation
# makes that one pause per broker every ~2.5 min; the first one, though, copied what start-up
# left — mostly the log cleaner's buffer, now 16 MB (BENCH_BROKER_CONFIG) — and
# ``_collect_broker_heaps`` moves what remains to the old generation before the first run.
# Same heap profile as ``purgatory bench kafka``'s broker (``BENCH_HEAP_OPTIONS``). The bench
# prints the brokers' pauses per run.


# Broker settings of the bench's cluster. The log cleaner (it compacts __consumer_offsets)
# allocates its dedupe buffer on the heap, 128 MB by default: with the bench's 1 GB heap and
# 768 MB young generation that was 128 of each broker's 149 MB live (GC.class_histogram: 140 MB
# of byte[]) in a 256 MB old generation, so the second young collection's promotion overflowed
# it: a failed young collection and a full one, 590-1,230 ms per broker at load 13-17
# (-Xlog:gc), inside a measured run. 16 MB is plenty for a few consumer groups' offsets (Kafka
# requires 1 MB per cleaner thread).
BENCH_BROKER_CONFIG = {"log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024)}

# The warm-up goes on in rounds of WARMUP_ROUND_S (half each side) past its minimum until, in a
# round, the brokers' JIT compiler threads spent less than JIT_SETTLED_US per request on both
# sides. Measured at 3 brokers (docs/performance.md, "The slow first run"): after the 20 s
# warm-up the compiler threads still spent 250-400 us per request (of 600-1,000 for the brokers
# in all), and the first measured run paid that; later runs 120-300 at load 17.
WARMUP_ROUND_S = 10.0
JIT_SETTLED_US = 100.0


def _warm_up(
    bootstrap: str,
    topics: BenchTopics,
    brokers: int,
    rate: float,
    linger_ms: int,
    broker_pids: tuple[int, ...],
    *,
    min_s: float,
    max_s: float,
) -> list[RunResult]:
    """Unmeasured traffic through brokers and responder until the JIT has compiled the hot paths
    (with C2 the first seconds cost extra CPU and stall requests while methods compile): both
    sides in turn on the runs' topics, for ``min_s`` then rounds of ``WARMUP_ROUND_S`` until the
    JIT settles (``JIT_SETTLED_US``) or ``max_s`` of traffic is spent. Identical for both sides;
    nothing of it is measured. Returns its runs (the bench prints their JIT CPU)."""
    runs: list[RunResult] = []
    spent, round_s = 0.0, min_s
    while round_s > 0:
        round_runs: list[RunResult] = []
        for side in ("purgatory", "hand-rolled"):
            run = run_once(
                side, bootstrap, topics.requests, brokers, reply_topic=topics.replies,
                rate=rate, warmup_s=round_s / 2, duration_s=0.5, timeout_ms=5_000,
                linger_ms=linger_ms, broker_pids=broker_pids,
            )  # fmt: skip
            round_runs.append(run)
        runs.extend(round_runs)
        spent += round_s
        settled = all(r.brokers_jit_cpu_us_per_request < JIT_SETTLED_US for r in round_runs)
        round_s = 0.0 if settled or spent + WARMUP_ROUND_S > max_s else WARMUP_ROUND_S
    return runs


def request_reply(
    brokers: Annotated[
        list[int] | None, typer.Option("--brokers", help="Broker counts (default 1 and 3).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Requests per second (paced).")] = TARGET_RATE,
    duration: Annotated[float, typer.Option(help="Measured seconds per run.")] = 10.0,
    warmup: Annotated[float, typer.Option(help="Unmeasured seconds before each run.")] = 2.0,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1, help="Runs per side (medians).")] = 3,
    timeout_ms: Annotated[int, typer.Option(help="Each request's deadline.")] = 5_000,
    linger_ms: Annotated[int, typer.Option(help="linger.ms of requests and replies (both sides).")] = 2,
    jit: Annotated[
        str, typer.Option(help="Broker JVM JIT: 'full' (C1+C2, steady state) or 'c1' (fast start).")
    ] = "full",
    jit_warmup: Annotated[
        float, typer.Option(help="Unmeasured seconds of traffic per cluster before the first run, at least.")
    ] = 20.0,
    jit_warmup_max: Annotated[
        float,
        typer.Option(help="... at most: more rounds while the brokers' JIT still compiles (JIT_SETTLED_US)."),
    ] = 120.0,
    out: Annotated[Path, typer.Option(help="Directory for the JSON result file.")] = Path("bench-results"),
) -> None:
    """Request-reply round trips (p50/p99) and requests/s on a local Kafka, vs a hand-rolled requester."""
    from purgatory import configure_logging

    configure_logging("WARNING", "console", force=True)
    if jit not in JVM_PROFILES:
        raise typer.BadParameter(f"--jit must be one of {sorted(JVM_PROFILES)}, got {jit!r}")
    all_runs: list[RunResult] = []
    for count in brokers or [1, 3]:
        started = time.monotonic()
        jvm_options = (*JVM_PROFILES[jit], *BENCH_HEAP_OPTIONS)
        with LocalKafkaCluster(
            brokers=count, jvm_options=jvm_options, heap_mb=BENCH_HEAP_MB, broker_config=BENCH_BROKER_CONFIG
        ) as cluster:
            start_s = time.monotonic() - started
            bootstrap = cluster.bootstrap_servers
            topics = _create_bench_topics(bootstrap, count)
            responder = _ResponderProcess(
                topics.requests, f"bench-echo-{uuid.uuid4().hex[:6]}", bootstrap, linger_ms
            )
            typer.echo(
                f"{count} broker(s) at {bootstrap} (JIT {jit}, heap fixed at {BENCH_HEAP_MB} MB, "
                f"started in {start_s:.1f} s, "
                f"load {os.getloadavg()[0]:.1f}): {rate:.0f} requests/s for {duration:.0f} s "
                f"(+{warmup:.0f} s warm-up) x {repeats}, linger.ms {linger_ms}, "
                f"echo responder in process {responder.process.pid}; leaders: {_leaders(bootstrap, topics)}"
            )
            try:
                broker_pids = tuple(n.pid for n in cluster.nodes.values() if n.pid is not None)
                warm = _warm_up(
                    bootstrap, topics, count, rate, linger_ms, broker_pids,
                    min_s=jit_warmup, max_s=max(jit_warmup, jit_warmup_max),
                )  # fmt: skip
                for result in warm:
                    typer.echo(
                        f"  warm-up {result.side:<11} brokers "
                        f"{result.brokers_cpu_us_per_request:4.0f} us/req, of which JIT "
                        f"{result.brokers_jit_cpu_us_per_request:4.0f}  p99 {result.p99_ms:6.1f} ms"
                    )
                _collect_broker_heaps(list(broker_pids))
                runs: list[RunResult] = []
                for i in range(repeats):
                    order = ("purgatory", "hand-rolled") if i % 2 == 0 else ("hand-rolled", "purgatory")
                    for side in order:
                        result = run_once(
                            side, bootstrap, topics.requests, count, reply_topic=topics.replies,
                            rate=rate, warmup_s=warmup, duration_s=duration, timeout_ms=timeout_ms,
                            linger_ms=linger_ms, responder_pid=responder.process.pid,
                            broker_pids=broker_pids,
                        )  # fmt: skip
                        runs.append(result)
                        leaders = _leaders(bootstrap, topics)
                        typer.echo(
                            f"  run {i + 1} {side:<11} {result.achieved_per_s:7.0f} req/s  "
                            f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                            f"max {result.max_ms:7.2f} ms  "
                            f"timeouts {result.timeouts}  cpu us/req: requester "
                            f"{result.cpu_us_per_request:4.0f} "
                            f"responder {result.responder_cpu_us_per_request:4.0f} "
                            f"brokers {result.brokers_cpu_us_per_request:4.0f} "
                            f"(JIT {result.brokers_jit_cpu_us_per_request:3.0f})  "
                            f"GC {result.gc_ms:.0f} ms ({result.gc_full} full)  "
                            f"broker GC {result.broker_gc_pauses} taking {result.broker_gc_ms:.0f} ms  "
                            f"load {os.getloadavg()[0]:.1f}  "
                            f"10 ms sleep woke late p99 {result.wake_p99_ms:.1f} ms "
                            f"max {result.wake_max_ms:.0f} ms  leaders: {leaders}"
                        )
            finally:
                responder.stop()
            all_runs.extend(runs)
            ours = [r for r in runs if r.side == "purgatory"]
            base = [r for r in runs if r.side == "hand-rolled"]
            ratios = [a.p99_ms / b.p99_ms for a, b in zip(ours, base, strict=True)]
            p99 = _median(ours, "p99_ms")
            typer.echo(
                f"{count} broker(s), medians of {repeats}: "
                f"purgatory {_median(ours, 'achieved_per_s'):.0f} req/s "
                f"p50 {_median(ours, 'p50_ms'):.2f} ms p99 {p99:.2f} ms "
                f"cpu {_median(ours, 'cpu_us_per_request'):.0f} us/req | hand-rolled p50 "
                f"{_median(base, 'p50_ms'):.2f} ms p99 {_median(base, 'p99_ms'):.2f} ms | "
                f"p99 ratio (same run) {statistics.median(ratios):.2f}"
            )
            met = "met" if p99 <= TARGET_P99_MS and rate >= TARGET_RATE else "NOT met"
            typer.echo(f"target p99 <= {TARGET_P99_MS:.0f} ms at {TARGET_RATE:.0f} requests/s: {met}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"request-reply-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps([asdict(r) for r in all_runs], indent=1))
    typer.echo(f"results: {path} (shared machine: compare same-run ratios)")


if __name__ == "__main__":
    if len(sys.argv) in (5, 6) and sys.argv[1] == "responder":
        _responder_main(*sys.argv[2:])
    else:
        sys.exit("usage: python -m purgatory.tools.bench.reply.request_reply responder TOPIC GROUP BOOTSTRAP")
