"""``purgatory bench kafka``: completion lag and request rate of the change feed on a real cluster.

Workload: one topic with ``partitions`` partitions; ``pending`` ``DelayedReplication`` operations
spread evenly, each waiting for a *future* offset of its partition (so it completes when that
record is appended). A producer thread appends records to random partitions at ``rate`` per
second; each record completes exactly one operation, which is immediately replaced by one
waiting further ahead, so the pending count stays constant.

Figures, per pending count (the second count shows the cost does not depend on it):

* completion lag: from the ``produce()`` call of record ``k`` to the ``on_complete`` of the
  operation waiting for ``k`` (p50 / p99 / max) — includes the broker round trip, the tail's
  fetch (push mode; the wait for the next poll in poll mode) and the purgatory's check; also
  from the delivery report (the broker's acknowledgement, seen by the producer thread's
  ``poll``). Counted for the records *sent* inside the measured window, which opens (push mode)
  once the tail follows every partition plus ``WARMUP_S``: records appended while the tail was
  being assigned are answered by the poll, a start-up cost (seconds, measured) and not the
  steady state this figure is for;
* the same lag seen by a bare consumer (``assign``, no purgatory, the tail's fetch settings)
  tailing the topic in the same process during the same run: the floor this machine and broker
  give right now (on a shared machine the broker's stalls — its GC, CPU starvation — reach every
  client alike), and, per record, the completion's lag over that floor (p50 / p99): what the
  purgatory adds;
* the feed's work per high-watermark advance: operations tried (the offset index tries only the
  due ones) and ``check_and_complete`` calls;
* requests sent to Kafka per second and per poll, polls per second, poll duration;
* when the bench started the broker itself: the broker JVM's stop-the-world pauses in the window
  (count, total, longest; ``broker_pauses.py``) and how many of the slowest 1% of completions
  had one while in flight.

The broker: an existing cluster (``PURGATORY_KAFKA_BOOTSTRAP``) is used as it runs. A local one
started by the bench runs the steady-state profile ``STEADY_STATE_PROFILE`` below, not the
launcher's fast start for tests: with the fast start (C1 only, heap from 64 MB, Kafka's
default purge interval) the broker, answering ~1,000 fetches of 100 partitions a second,
allocated ~250-300 MB/s and stopped for a young collection every ~0.35 s (13-200 ms each, ~8%
of the time), which was the p99 of every client (docs/performance.md). The steady profile's
young pauses are then cut by promoting survivors at once (``BENCH_GC_OPTIONS``).

Same-period A/B: ``--broker-profile`` repeated (a profile name plus ``,-XX:...`` JVM options or
``,key=value`` broker settings each) and ``--rounds`` alternate brokers within one invocation;
``--floor alternate`` runs the bare consumer in its own runs instead of next to ours, so the
broker answers one consumer's fetches at a time; ``--broker-logs`` keeps the GC and safepoint
logs. Each broker's collections in the measured windows (pause, CPU, survivors copied; from its
GC log) and its stops by cause (safepoint log) are printed.
"""

from __future__ import annotations

import gc
import math
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from purgatory.adapters.kafka import (
    TAIL_FETCH_WAIT_MS,
    ChangeFeed,
    DelayedReplication,
    DelayedTopicReady,
    KafkaOperation,
    KafkaPurgatory,
    TopicPartitionKey,
    provide_cluster,
)
from purgatory.adapters.kafka.local import DEFAULT_HEAP_MB, FAST_START_JVM_OPTIONS, STEADY_STATE_JVM_OPTIONS
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory.settings import load_settings

from ..measure import percentile
from .broker_pauses import (
    Collection,
    PauseSummary,
    gc_log_option,
    read_collections,
    read_pauses,
    safepoint_log_option,
    summarize,
)

__all__ = ["BenchResult", "kafka", "run_once"]

WARMUP_S = 1.0  # after the tail follows every partition: first pushes, the broker's JIT; not measured
FOLLOW_TIMEOUT_S = 60.0  # bound on waiting for the tail to follow every partition (push mode)
FOLLOW_POLL_S = 0.05
FLOOR_ROUND_S = 0.1  # the bare consumer's poll timeout (as the tail's ROUND_S)
GRACE_S = 1.0  # after the window: completions of records sent at its end are still counted
OP_TIMEOUT_MS = 600_000  # nothing may expire during a run: every completion is a Kafka event
TARGET_LAG_P99_MS = 5.0  # issue 12: Kafka-backed completion lag p99 at 10,000 pending
SLOW_SHARE = 0.01  # the slowest 1% of completions: the records behind the p99


@dataclass(frozen=True)
class BrokerProfile:
    """How the bench starts its own local broker (JVM options, heap, broker settings)."""

    jvm_options: tuple[str, ...]
    heap_mb: int
    broker_config: dict[str, str]

    def describe(self) -> str:
        settings = "".join(f", {k}={v}" for k, v in self.broker_config.items())
        return f"{' '.join(self.jvm_options)} -Xmx{self.heap_mb}m{settings}"


# The bench's own broker (module doc; measured in docs/performance.md). Each choice cuts the
# broker's young-collection pauses, which stall every client:
BENCH_HEAP_MB = 1024  # Kafka's own kafka-server-start.sh heap (-Xmx1G -Xms1G)
# The heap of every bench's own brokers (`purgatory bench request-reply` too):
BENCH_HEAP_OPTIONS: tuple[str, ...] = (
    f"-Xms{BENCH_HEAP_MB}m",  # fixed at its maximum: the young generation does not start at ~20 MB
    "-Xmn768m",  # a large young generation: one collection every ~3 s instead of every ~0.35 s
)
# How the young pauses were cut further (issue 12; GC log with survivor ages, docs/performance.md).
# Of the ~8 MB each serial young collection copied, ~85% were cohorts aged 2 to 15 copied again at
# every collection (the age table showed the same 1-3 MB cohorts at ages 5, 6, 7, ...): objects
# that live for seconds to minutes (a bench topic's partitions, logs and indexes, metrics).
# Promoted at their first survival instead, a young pause copies only that collection's new
# survivors (~0.8 MB): pause CPU ~20 -> ~10 ms. The old generation grows by ~0.2 MB/s: with the
# cleaner's buffer made small (below) its ~200 MB free last ~15 minutes of this load before a
# full collection (the bench prints any in a window).
BENCH_GC_OPTIONS: tuple[str, ...] = (
    "-XX:MaxTenuringThreshold=1",
    # The log cleaner's 128 MB dedupe buffer (one byte array, allocated at start-up) went to the
    # young generation, overflowed the survivor space in the first collection (a ~150 MB
    # promotion, 0.1-1.5 s), and that promotion's average then made the serial collector judge
    # young collections unsafe (the old generation's ~85 MB free is less than the padded average
    # promotion): a full collection (0.2-0.6 s) instead of the next young one, and in one variant
    # tried (with -XX:+AlwaysPreTouch and others) instead of every young one. Arrays of 1 MB or
    # more now start in the old generation: the first young pause 0.36 s -> 40 ms, no full one.
    "-XX:PretenureSizeThreshold=1048576",
    # No periodic "Cleanup" safepoint (every 1 s by default when anything is due): each stops
    # every thread; at load 10-17 a quarter of them took 5-126 ms, nearly all of it reaching the
    # safepoint (threads waiting for a core). Their work is done at the next collection's.
    "-XX:+UnlockDiagnosticVMOptions",
    "-XX:GuaranteedSafepointInterval=0",
)
STEADY_STATE_PROFILE = BrokerProfile(
    # C1 then C2, the steady-state code a production broker runs
    jvm_options=(*STEADY_STATE_JVM_OPTIONS, *BENCH_HEAP_OPTIONS, *BENCH_GC_OPTIONS),
    heap_mb=BENCH_HEAP_MB,
    broker_config={
        # A consumer's fetch (librdkafka has no fetch sessions: all 100 partitions each time)
        # waits on every partition's watcher list; a record on one completes it, and the done
        # fetch stays referenced from the other 99 lists until the purge, every 1,000 requests
        # by default: ~25 MB of them survived each young collection, whose pause is the copy of
        # the survivors. Purged every 10 requests, ~8 MB survive.
        "fetch.purgatory.purge.interval.requests": "10",
        # The log cleaner's dedupe buffer (128 MB by default, on the heap for the broker's life)
        # took half the old generation: 16 MB is plenty for the few keys of __consumer_offsets
        # here, and the old generation's free space grows from ~85 to ~200 MB (see above).
        "log.cleaner.dedupe.buffer.size": "16777216",
    },
)
# The launcher's fast start (what the tests run): kept selectable for same-period A/B runs.
FAST_START_PROFILE = BrokerProfile(FAST_START_JVM_OPTIONS, DEFAULT_HEAP_MB, {})
# Kafka's own production profile (kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS, the heap of
# kafka-server-start.sh), for comparison: measured worse here (docs/performance.md): to keep its
# 20 ms pause goal G1 shrinks the young generation and collects 4 times a second on this load.
KAFKA_G1_PROFILE = BrokerProfile(
    (
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-XX:MaxInlineLevel=15",
        "-Xms1024m",
    ),
    1024,
    {},
)
BROKER_PROFILES: dict[str, BrokerProfile] = {
    "steady": STEADY_STATE_PROFILE,
    "fast-start": FAST_START_PROFILE,
    "kafka-g1": KAFKA_G1_PROFILE,
}


def parse_broker_profile(spec: str) -> BrokerProfile:
    """``NAME[,ITEM...]``: a profile of ``BROKER_PROFILES`` with each ITEM added, a JVM option
    (``-XX:GuaranteedSafepointInterval=0``; a later option wins over the profile's) or a broker
    setting (``num.io.threads=2``). So one invocation can alternate flag variants (A/B in the
    same period). A bad spec is a ``ValueError`` naming the item and why."""
    name, *items = spec.split(",")
    if name not in BROKER_PROFILES:
        raise ValueError(
            f"--broker-profile {spec!r}: the profile {name!r} is not one of {sorted(BROKER_PROFILES)}"
        )
    base = BROKER_PROFILES[name]
    jvm, config = list(base.jvm_options), dict(base.broker_config)
    for item in items:
        if item.startswith("-") and " " not in item and not item.startswith(("-Xmx", "-cp", "-classpath")):
            jvm.append(item)
        elif "=" in item and not item.startswith("-") and item.split("=", 1)[0]:
            key, value = item.split("=", 1)
            config[key] = value
        else:
            raise ValueError(
                f"--broker-profile {spec!r}: {item!r} is neither a JVM option ('-...', one word, not "
                f"-Xmx/-cp: the heap is the profile's) nor a broker setting ('key=value')"
            )
    return BrokerProfile(tuple(jvm), base.heap_mb, config)


@dataclass(frozen=True)
class BenchResult:
    pending: int
    partitions: int
    completions: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    ack_lag_p50_ms: float
    ack_lag_p99_ms: float
    floor_p50_ms: float  # produce() -> a bare consumer read the record
    floor_p99_ms: float
    over_floor_p50_ms: float  # per record: completion lag less the bare consumer's
    over_floor_p99_ms: float
    tries_per_advance: float  # operations tried per high-watermark advance served by the index
    checks: int  # check_and_complete calls (changes other than an advance, unindexed purgatories)
    requests_per_s: float
    requests_per_poll: float
    polls_per_s: float
    poll_p50_ms: float
    pending_at_end: int
    gc_collections: int
    gc_ms: float
    broker_pauses: PauseSummary | None = None  # only for a broker the bench started (module doc)
    broker_collections: tuple[Collection, ...] = ()  # its collections ending in the window (GC log)


class _GcClock:
    """Counts the cyclic collector's runs and time (its pauses stall every thread, the feed included)."""

    def __init__(self) -> None:
        self.collections = 0
        self.total_ms = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections += 1
            self.total_ms += (time.perf_counter() - self._started) * 1000.0


class _Workload:
    """Keeps ``pending`` operations waiting, replaces each completed one, records lags."""

    def __init__(self, kp: KafkaPurgatory, topic: str, partitions: int, pending: int) -> None:
        self.kp = kp
        self.keys = [TopicPartitionKey(topic, p) for p in range(partitions)]
        self.next_target = [0] * partitions
        self.per_partition = pending // partitions
        self.sent_ns: dict[tuple[int, int], int] = {}  # produce() called
        self.acked_ns: dict[tuple[int, int], int] = {}  # delivery report: the broker appended it
        self.done: list[tuple[int, int, int]] = []  # (partition, offset, completed_ns)
        self.measuring = False
        self._lock = threading.Lock()

    def submit(self, partition: int) -> None:
        with self._lock:
            target = self.next_target[partition]
            self.next_target[partition] += 1
        key = self.keys[partition]
        op = DelayedReplication(
            self.kp.feed, {key: target}, delay_ms=OP_TIMEOUT_MS, on_response=self._completed
        )
        self.kp.submit(op, validate=False)

    def _completed(self, op: KafkaOperation) -> None:
        now = time.monotonic_ns()
        assert isinstance(op, DelayedReplication)
        ((key, offset),) = op.appended.items()
        if self.measuring:
            self.done.append((key.partition, offset, now))
        if not self.kp.purgatory_for(op).closed:
            self.submit(key.partition)  # keep the pending count constant

    def lags_ms(self, since: dict[tuple[int, int], int], window: tuple[int, int]) -> list[float]:
        """Lags of the records whose ``produce()`` was called inside ``window`` (monotonic ns).

        Only those: a record sent before the window (during set-up, while the tail was still
        being assigned its partitions) measures the start-up, not the steady state.
        """
        start, end = window
        lags = []
        for partition, offset, completed in self.done:
            sent = since.get((partition, offset))
            if sent is not None and start <= self.sent_ns.get((partition, offset), -1) < end:
                lags.append((completed - sent) / 1e6)
        return sorted(lags)

    def slowest(
        self, window: tuple[int, int], share: float, read_ns: dict[tuple[int, int], int] | None = None
    ) -> list[tuple[int, int]]:
        """``(sent_ns, completed_ns)`` of the slowest ``share`` of the window's completions (of
        the bare consumer's reads, given its ``read_ns``)."""
        start, end = window
        in_flight = []
        done = self.done if read_ns is None else [(p, o, t) for (p, o), t in read_ns.items()]
        for partition, offset, completed in done:
            sent = self.sent_ns.get((partition, offset), -1)
            if start <= sent < end:
                in_flight.append((sent, completed))
        in_flight.sort(key=lambda pair: pair[1] - pair[0])
        return in_flight[len(in_flight) - max(1, int(len(in_flight) * share)) :] if in_flight else []


class _FloorTail:
    """A bare consumer tailing the bench topic (assign at the end, no group, the tail's fetch
    settings): when each record reached a client that does nothing else (module doc)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-floor-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "latest",
                "fetch.wait.max.ms": TAIL_FETCH_WAIT_MS,
                "fetch.min.bytes": 1,
                "socket.nagle.disable": True,
                "log_level": 0,
            }
        )
        self.partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
        self.read_ns: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self.ready = threading.Event()  # every partition has a high watermark: records are read
        self._thread = threading.Thread(target=self._run, name="bench-floor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        read_ns = self.read_ns
        while not self._stop.is_set():
            first = self.consumer.poll(FLOOR_ROUND_S)
            if not self.ready.is_set() and self._has_high_watermarks():
                self.ready.set()
            if first is None:
                continue
            now = time.monotonic_ns()
            for message in (first, *self.consumer.consume(1000, 0)):
                if message.error() is None:
                    read_ns[message.partition() or 0, message.offset() or 0] = now

    def _has_high_watermarks(self) -> bool:
        """True once a fetch response gave every partition's high watermark (as the tail's
        ``following``): it reads from a fixed position, so every record from now on reaches it.
        Asked on the consumer's own thread: called from another while this one was inside
        ``poll``, the consumer's calls blocked for good."""
        for tp in self.partitions:
            try:
                _low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                return False
            if high < 0:
                return False
        return True

    def following(self) -> bool:
        return self.ready.is_set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def _wait_until_tailed(feed: ChangeFeed, keys: list[TopicPartitionKey], floor: _FloorTail | None) -> None:
    """Until the tail follows every partition of ``keys`` in push mode (before, the poll
    answers) and the bare consumer, if any, has its positions (bounded)."""
    tail = feed.tail
    deadline = time.monotonic() + FOLLOW_TIMEOUT_S
    while not (
        (floor is None or floor.following()) and (tail is None or all(tail.following(key) for key in keys))
    ):
        if time.monotonic() > deadline:
            following = len(tail.stats.following) if tail is not None else len(keys)
            raise RuntimeError(
                f"the tail follows {following} of {len(keys)} partitions (bare consumer: "
                f"{'ready' if floor is None or floor.following() else 'no positions'}) "
                f"after {FOLLOW_TIMEOUT_S:.0f} s"
            )
        time.sleep(FOLLOW_POLL_S)


def _producer_loop(
    producer: Producer,
    workload: _Workload,
    rate: float,
    stop: threading.Event,
    on_error: Callable[[str], None],
) -> None:
    topic = workload.keys[0].topic
    partitions = len(workload.keys)
    period = 1.0 / rate
    next_send = time.monotonic()
    while not stop.is_set():
        partition = random.randrange(partitions)
        sent = time.monotonic_ns()

        def delivered(error: KafkaError | None, message: Message, sent: int = sent) -> None:
            if error is not None:
                on_error(str(error))
            else:
                where = (message.partition() or 0, message.offset() or 0)
                workload.acked_ns[where] = time.monotonic_ns()
                workload.sent_ns[where] = sent

        producer.produce(topic, b"e", partition=partition, on_delivery=delivered)
        producer.poll(0)
        next_send += period
        delay = next_send - time.monotonic()
        if delay > 0:
            stop.wait(delay)  # pacing the event rate
    producer.flush(10)


def run_once(
    settings: KafkaSettings,
    *,
    pending: int,
    partitions: int,
    rate: float,
    duration_s: float,
    safepoint_log: Path | None = None,
    gc_log: Path | None = None,
    ours: bool = True,
    floor: bool = True,
) -> BenchResult:
    """One measured run (see the module docstring). ``safepoint_log``: the broker JVM's
    ``-Xlog:safepoint`` file, when the bench started the broker with it; ``gc_log`` its GC log
    (``gc_log_option``). ``ours`` / ``floor``:
    whether the purgatory's operations (and so its tail) and the bare consumer run; with one of
    them only, the broker answers one consumer's fetches instead of two (``--floor alternate``),
    and the other's figures are NaN."""
    if not (ours or floor):
        raise ValueError("run_once: ours and floor both off, nothing to measure")
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    bootstrap = settings.bootstrap_servers or ""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=30).values():
        future.result(timeout=30)
    errors: list[str] = []
    with KafkaPurgatory.connect(settings, name=f"bench-{pending}") as kp:
        # Wait for the new topic's leaders with the purgatory itself.
        ready = kp.submit(DelayedTopicReady(kp.feed, topic, delay_ms=30_000))
        if not (ready.wait(35.0) and ready.ready):
            raise RuntimeError(f"benchmark topic {topic} has no leaders after 30 s")
        workload = _Workload(kp, topic, partitions, pending if ours else 0)
        for i in range(workload.per_partition * partitions):
            workload.submit(i % partitions)
        floor_tail = _FloorTail(bootstrap, topic, partitions) if floor else None
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "1",
                "linger.ms": 0,
                "log_level": 0,
                "socket.nagle.disable": True,
            }
        )
        stop = threading.Event()
        thread = threading.Thread(
            target=_producer_loop, args=(producer, workload, rate, stop, errors.append), name="bench-producer"
        )
        thread.start()
        gc_clock = _GcClock()
        # Objects alive after set-up (the 10k operations, clients, modules) are moved out of the
        # collector's reach, as a latency-sensitive service does after start-up: otherwise each
        # full collection walks them all and pauses every thread, the feed included.
        gc.freeze()
        gc.callbacks.append(gc_clock)
        try:
            feed: ChangeFeed = kp.feed
            _wait_until_tailed(feed, workload.keys if ours else [], floor_tail)
            time.sleep(WARMUP_S)  # the benchmark's own clock: warm-up, then a fixed window
            workload.measuring = True
            polls0, req0, t0 = feed.stats.polls, kp.view.requests_sent, time.monotonic()
            wakes0, tries0, checks0 = feed.stats.indexed_wakes, feed.stats.indexed_tries, feed.stats.checks
            window_start = time.monotonic_ns()
            poll_ms0 = len(feed.stats.poll_ms)
            time.sleep(duration_s)
            window_end = time.monotonic_ns()
            polls1, req1, t1 = feed.stats.polls, kp.view.requests_sent, time.monotonic()
            wakes1, tries1, checks1 = feed.stats.indexed_wakes, feed.stats.indexed_tries, feed.stats.checks
            # Records sent near the end complete after it: a grace period, so none is counted
            # as missing or biases the tail of the distribution towards the fast ones.
            time.sleep(GRACE_S)
            workload.measuring = False
            poll_ms = sorted(feed.stats.poll_ms[poll_ms0:])
        finally:
            gc.callbacks.remove(gc_clock)
            gc.unfreeze()
            stop.set()
            thread.join(30)
            if floor_tail is not None:
                floor_tail.close()
        pending_at_end = sum(p.num_delayed() for p in kp.purgatories.values())
    for future in admin.delete_topics([topic], request_timeout=30).values():
        future.result(timeout=30)
    if errors:
        raise RuntimeError(f"producer errors during the benchmark: {errors[:3]}")
    window = (window_start, window_end)
    lags = workload.lags_ms(workload.sent_ns, window)
    from_ack = workload.lags_ms(workload.acked_ns, window)
    floor_read = floor_tail.read_ns if floor_tail is not None else {}
    floor_lags = sorted(
        (read - workload.sent_ns[where]) / 1e6
        for where, read in floor_read.items()
        if where in workload.sent_ns and window_start <= workload.sent_ns[where] < window_end
    )
    over_floor = workload.lags_ms(floor_read, window)  # completion - the bare consumer's read
    broker_pauses = None
    if safepoint_log is not None:
        slowest = workload.slowest(window, SLOW_SHARE, None if ours else floor_read)
        broker_pauses = summarize(read_pauses(safepoint_log.read_text(errors="replace")), window, slowest)
    collections: tuple[Collection, ...] = ()
    if gc_log is not None and gc_log.exists():
        collections = tuple(
            c
            for c in read_collections(gc_log.read_text(errors="replace"))
            if window_start <= c.end_ns < window_end
        )
    elapsed = t1 - t0
    polls = max(polls1 - polls0, 1)
    return BenchResult(
        pending=workload.per_partition * partitions,
        partitions=partitions,
        completions=len(lags),
        lag_p50_ms=percentile(lags, 0.50),
        lag_p99_ms=percentile(lags, 0.99),
        lag_max_ms=lags[-1] if lags else float("nan"),
        ack_lag_p50_ms=percentile(from_ack, 0.50),
        ack_lag_p99_ms=percentile(from_ack, 0.99),
        floor_p50_ms=percentile(floor_lags, 0.50),
        floor_p99_ms=percentile(floor_lags, 0.99),
        over_floor_p50_ms=percentile(over_floor, 0.50),
        over_floor_p99_ms=percentile(over_floor, 0.99),
        tries_per_advance=(tries1 - tries0) / max(wakes1 - wakes0, 1),
        checks=checks1 - checks0,
        requests_per_s=(req1 - req0) / elapsed,
        requests_per_poll=(req1 - req0) / polls,
        polls_per_s=polls / elapsed,
        poll_p50_ms=statistics.median(poll_ms) if poll_ms else float("nan"),
        pending_at_end=pending_at_end,
        gc_collections=gc_clock.collections,
        gc_ms=gc_clock.total_ms,
        broker_pauses=broker_pauses,
        broker_collections=collections,
    )


def _p99_rank(result: BenchResult) -> float:
    return math.inf if math.isnan(result.lag_p99_ms) else result.lag_p99_ms


def _floor_p99_rank(result: BenchResult) -> float:
    return math.inf if math.isnan(result.floor_p99_ms) else result.floor_p99_ms


FLOOR_MODES = ("concurrent", "alternate")


@dataclass(frozen=True)
class _BrokerPass:
    """One broker's figures: the median run of each pending count (ours; in ``--floor
    alternate`` also the bare consumer's own runs)."""

    local: bool  # the bench started this broker (profiles and pause logs apply)
    medians: dict[int, BenchResult]
    floor_medians: dict[int, BenchResult]


def _describe_pauses(label: str, pauses: PauseSummary) -> str:
    return (
        f"{label}: the broker stopped {pauses.count} times (>= 1 ms) in the window, "
        f"{pauses.total_ms:.0f} ms in all, longest {pauses.max_ms:.1f} ms ({pauses.describe_causes()}); "
        f"{pauses.slow_hit} of the slowest {pauses.slow} had a pause in flight"
    )


def _describe_collections(label: str, collections: list[Collection]) -> str:
    """The young collections' pauses, survivors (what each pause copies) and CPU (a pause much
    longer than its CPU waited for a core), and the count of full collections."""
    young = [c for c in collections if c.kind == "Young"]
    full = [c for c in collections if c.kind == "Full"]
    if not young:
        return f"{label}: no young collection; {len(full)} full"
    pause = statistics.median(c.pause_ms for c in young)
    cpu = statistics.median(c.cpu_ms for c in young)
    survived = statistics.median(c.survived_bytes for c in young) / 1e6
    return (
        f"{label}: {len(young)} young collections, pause median {pause:.1f} / "
        f"max {max(c.pause_ms for c in young):.1f} ms, CPU median {cpu:.0f} ms, "
        f"survivors median {survived:.1f} MB; "
        f"{len(full)} full ({', '.join(f'{c.cause} {c.pause_ms:.0f} ms' for c in full) or 'none'})"
    )


def _bench_broker(
    settings: KafkaSettings,
    spec: str,
    profile: BrokerProfile,
    *,
    counts: tuple[int, int],
    partitions: int,
    rate: float,
    duration: float,
    repeats: int,
    floor: str,
    jit_warmup: float,
    keep_logs: Path | None,
) -> _BrokerPass:
    """Start the broker of ``profile`` (or use an existing cluster), warm it, measure both counts."""
    with (
        tempfile.TemporaryDirectory(prefix="purgatory-bench-kafka-") as scratch,
        provide_cluster(
            settings,
            jvm_options=(
                *profile.jvm_options,
                safepoint_log_option(Path(scratch) / "safepoints.log"),
                gc_log_option(Path(scratch) / "gc.log"),
            ),
            heap_mb=profile.heap_mb,
            broker_config=profile.broker_config,
        ) as cluster,
    ):
        local = cluster.local is not None
        kafka_settings = settings.model_copy(update={"bootstrap_servers": cluster.bootstrap_servers})
        # Only a broker we started logs its safepoints to our file (an existing one runs as it is).
        safepoint_log = Path(scratch) / "safepoints.log" if local else None
        gc_log = Path(scratch) / "gc.log" if local else None
        broker = (
            f"the bench's broker, {spec}: {profile.describe()}" if local else "an existing broker, as it runs"
        )
        warmed = f" after {jit_warmup:.0f} s unmeasured" if local and jit_warmup > 0 else ""
        typer.echo(
            f"Kafka via {cluster.provider} at {cluster.bootstrap_servers} ({broker}); feed interval "
            f"{settings.feed_interval_ms} ms; {partitions} partitions; {rate:.0f} events/s; "
            f"{duration:.0f} s runs{warmed}; bare consumer {floor}; load {os.getloadavg()[0]:.1f}"
        )
        if local and jit_warmup > 0:
            # A broker just started compiles its hot paths (C2 too in the steady profile) under
            # the first traffic: the first measured run after start-up twice had no completion
            # within its window at load 20. Warm it with the same workload, unmeasured.
            run_once(
                kafka_settings, pending=counts[1], partitions=partitions, rate=rate, duration_s=jit_warmup
            )
        header = (
            f"{'pending':>8} {'done':>6} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} "
            f"{'req/s':>7} {'req/poll':>8} {'polls/s':>7} {'poll p50':>8} {'GC runs/ms':>11}"
        )
        typer.echo(header)
        medians: dict[int, BenchResult] = {}
        floor_medians: dict[int, BenchResult] = {}
        collections: dict[int, list[Collection]] = {}
        for count in counts:

            def measure(ours: bool, floor_on: bool, count: int = count) -> BenchResult:
                return run_once(
                    kafka_settings,
                    pending=count,
                    partitions=partitions,
                    rate=rate,
                    duration_s=duration,
                    safepoint_log=safepoint_log,
                    gc_log=gc_log,
                    ours=ours,
                    floor=floor_on,
                )

            runs: list[BenchResult] = []
            floor_runs: list[BenchResult] = []
            for _ in range(repeats):
                if floor == "alternate":
                    # The bare consumer alone, then ours alone: the broker answers one consumer's
                    # fetches at a time (each names all 100 partitions), as a service would.
                    floor_runs.append(measure(ours=False, floor_on=True))
                    runs.append(measure(ours=True, floor_on=False))
                else:
                    runs.append(measure(ours=True, floor_on=True))
            # A run with no completion in its window has a NaN p99: the worst, not a random rank.
            result = sorted(runs, key=_p99_rank)[len(runs) // 2]
            medians[count] = result
            collections[count] = [c for r in runs for c in r.broker_collections]
            typer.echo(
                f"{result.pending:>8} {result.completions:>6} {result.lag_p50_ms:>6.1f}ms "
                f"{result.lag_p99_ms:>6.1f}ms "
                f"{result.lag_max_ms:>6.1f}ms {result.requests_per_s:>7.1f} {result.requests_per_poll:>8.2f} "
                f"{result.polls_per_s:>7.1f} {result.poll_p50_ms:>6.1f}ms "
                f"{result.gc_collections:>5}/{result.gc_ms:<5.0f}"
            )
            if repeats > 1:
                typer.echo(
                    f"{'':>8} lag p99 of each run: {' / '.join(f'{r.lag_p99_ms:.1f}' for r in runs)} ms"
                )
            if floor_runs:
                floor_result = sorted(floor_runs, key=_floor_p99_rank)[len(floor_runs) // 2]
                floor_medians[count] = floor_result
                typer.echo(
                    f"{'':>8} the bare consumer alone (its own runs, alternating): p50 "
                    f"{floor_result.floor_p50_ms:.1f} / p99 {floor_result.floor_p99_ms:.1f} ms; "
                    "p99 of each run: "
                    f"{' / '.join(f'{r.floor_p99_ms:.1f}' for r in floor_runs)} ms"
                )
        if keep_logs is not None and local:
            keep_logs.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%H%M%S")
            for name in ("safepoints.log", "gc.log"):
                if (Path(scratch) / name).exists():
                    shutil.copy(Path(scratch) / name, keep_logs / f"{stamp}-{spec.replace('/', '_')}-{name}")
    main, other = medians[counts[0]], medians[counts[1]]
    typer.echo(
        f"requests per poll, {main.pending} vs {other.pending} pending: "
        f"{main.requests_per_poll:.2f} vs {other.requests_per_poll:.2f} "
        f"(ratio {main.requests_per_poll / max(other.requests_per_poll, 1e-9):.2f}; 1.00 = independent)"
    )
    typer.echo(
        f"lag from the broker's acknowledgement (delivery report) at {main.pending} pending: "
        f"p50 {main.ack_lag_p50_ms:.1f} ms, p99 {main.ack_lag_p99_ms:.1f} ms"
    )
    for result in (main, other):
        if floor == "concurrent":
            typer.echo(
                f"{result.pending} pending: a bare consumer read the records p50 {result.floor_p50_ms:.1f} / "
                f"p99 {result.floor_p99_ms:.1f} ms (same run: the floor); completion over it, per record: "
                f"p50 {result.over_floor_p50_ms:.1f} / p99 {result.over_floor_p99_ms:.1f} ms; "
                f"{result.tries_per_advance:.2f} operations tried per high-watermark advance, "
                f"{result.checks} check_and_complete calls"
            )
        else:
            typer.echo(
                f"{result.pending} pending: {result.tries_per_advance:.2f} operations tried per "
                f"high-watermark advance, {result.checks} check_and_complete calls"
            )
    for count, done in collections.items():
        if local:
            typer.echo(_describe_collections(f"{count} pending, all {repeats} runs' windows", done))
    for result in (main, other):
        if result.broker_pauses is not None:
            typer.echo(_describe_pauses(f"{result.pending} pending", result.broker_pauses))
        alone = floor_medians.get(result.pending)
        if alone is not None and alone.broker_pauses is not None:
            typer.echo(
                _describe_pauses(f"{result.pending} pending, bare consumer alone", alone.broker_pauses)
            )
    return _BrokerPass(local, medians, floor_medians)


def _median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else float("nan")


def kafka(
    pending: Annotated[int, typer.Option(help="Pending operations in the main run.")] = 10_000,
    compare_pending: Annotated[int, typer.Option(help="Pending operations in the comparison run.")] = 1_000,
    partitions: Annotated[int, typer.Option(help="Partitions (watched keys).")] = 100,
    rate: Annotated[float, typer.Option(help="Records appended per second (Kafka events).")] = 500.0,
    duration: Annotated[float, typer.Option(help="Measured seconds per run.")] = 10.0,
    repeats: Annotated[int, typer.Option(help="Runs per pending count; medians are reported.")] = 1,
    broker_profile: Annotated[
        list[str] | None,
        typer.Option(
            help="The bench's own broker: 'steady', 'fast-start' (the tests' profile) or 'kafka-g1', "
            "each optionally followed by ',-XX:...' JVM options or ',key=value' broker settings. "
            "Repeat it to alternate brokers in one invocation (same-period A/B)."
        ),
    ] = None,
    rounds: Annotated[
        int, typer.Option(help="With several --broker-profile: passes over them, alternating.")
    ] = 1,
    floor: Annotated[
        str,
        typer.Option(
            help="The bare consumer: 'concurrent' (same runs as ours, per-record lag over it) or "
            "'alternate' (its own runs, floor then ours: the broker serves one consumer at a time)."
        ),
    ] = "concurrent",
    jit_warmup: Annotated[
        float, typer.Option(help="Unmeasured seconds of the workload on the bench's own broker first.")
    ] = 10.0,
    broker_logs: Annotated[
        Path | None, typer.Option(help="Keep each bench broker's safepoint and GC logs in this directory.")
    ] = None,
) -> None:
    """Completion lag (Kafka event → completion) and requests to Kafka, for two pending counts."""
    specs = broker_profile or ["steady"]
    try:
        profiles = [(spec, parse_broker_profile(spec)) for spec in specs]
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    if floor not in FLOOR_MODES:
        raise typer.BadParameter(f"--floor must be one of {list(FLOOR_MODES)}, got {floor!r}")
    if rounds < 1:
        raise typer.BadParameter(f"--rounds must be at least 1, got {rounds}")
    settings = load_settings().kafka
    passes: dict[str, list[_BrokerPass]] = {spec: [] for spec in specs}
    for _ in range(rounds):
        for spec, profile in profiles:
            done = _bench_broker(
                settings,
                spec,
                profile,
                counts=(pending, compare_pending),
                partitions=partitions,
                rate=rate,
                duration=duration,
                repeats=repeats,
                floor=floor,
                jit_warmup=jit_warmup,
                keep_logs=broker_logs,
            )
            passes[spec].append(done)
            if not done.local:
                break  # an existing cluster runs as it is: no profiles to alternate
        if not done.local:
            break
    if len(profiles) > 1 or rounds > 1:
        typer.echo(f"Same period, {pending} pending, each broker's median run (then the median of them):")
        for spec, results in passes.items():
            if not results:
                continue
            mains = [r.medians[pending] for r in results]
            pauses = [m.broker_pauses for m in mains if m.broker_pauses is not None]
            line = (
                f"  {spec}: p99 {' / '.join(f'{m.lag_p99_ms:.1f}' for m in mains)} ms "
                f"(median {_median([m.lag_p99_ms for m in mains]):.1f})"
            )
            if pauses:
                line += (
                    f"; pauses {' / '.join(str(p.count) for p in pauses)} "
                    f"(median {_median([float(p.count) for p in pauses]):.1f}), stopped "
                    f"{' / '.join(f'{p.total_ms:.0f}' for p in pauses)} ms, longest "
                    f"{' / '.join(f'{p.max_ms:.1f}' for p in pauses)} ms"
                )
            floors = [r.floor_medians[pending] for r in results if pending in r.floor_medians]
            if floors:
                line += f"; bare consumer alone p99 {' / '.join(f'{f.floor_p99_ms:.1f}' for f in floors)} ms"
            typer.echo(line)
    first = passes[specs[0]]
    p99 = _median([r.medians[pending].lag_p99_ms for r in first])
    target = "met" if p99 <= TARGET_LAG_P99_MS else "NOT met"
    typer.echo(
        f"p99 completion lag {p99:.1f} ms at {pending} pending ({specs[0]}): "
        f"target {TARGET_LAG_P99_MS:g} ms {target}"
    )
