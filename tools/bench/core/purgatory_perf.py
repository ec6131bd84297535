"""A port of Kafka's ``TestPurgatoryPerformance`` (``kafka.TestPurgatoryPerformance``).

Kafka's tool: a generator thread submits ``--num`` requests at ``--rate`` per second
(exponential inter-arrival times: a Poisson process), each watching the same ``--keys`` keys
drawn once from ``--key-space-size`` possible keys, with timeout ``--timeout``. Each request
"completes" after a latency drawn from a log-normal distribution fitted to ``--pct50`` and
``--pct75``; if that latency is below the timeout, a completion thread force-completes it at
that moment, otherwise it expires. It prints the target and actual enqueue rates, the process
CPU time and the GC counts and times. Here the same workload also runs on a naive pure-Python
purgatory (``baselines.NaivePurgatory``) as the baseline, each side in its own process, and every
request is checked to have finished exactly once.

Rate 0 means "as fast as the generator can go" (no sleeps), the setting of docs/performance.md's
purgatory figures.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from purgatory.adapters.service.settings import AdmissionSettings
from rich.console import Console

from purgatory import DelayedOperation, DelayedOperationPurgatory, _accel

from .._runner import Comparison, Target, side_specs
from ..measure import GcMeter, percentile
from .baselines import NaiveOperation, NaivePurgatory

__all__ = ["PurgatoryParams", "comparisons", "print_kafka_lines", "run_memory_side", "run_side"]

SIDES = ("purgatory", "naive")
JVM_SIDE = "jvm"  # Kafka's own DelayedOperationPurgatory (``--jvm``, see jvm.py)
DEFAULT_RATES = (100_000.0, 0.0)  # the two points of issue 15: paced at 100k/s, and unpaced
MEMORY_PENDING = 100_000  # operations kept pending to measure bytes per operation
NORMAL_75TH_PERCENTILE = 0.674490  # the 75th percentile point of N(0, 1), as in Kafka's tool
FINISH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class PurgatoryParams:
    num: int = 100_000
    rate: float = 0.0
    keys: int = 3
    key_space_size: int = 100
    timeout: int = 200
    pct50: float = 20.0
    pct75: float = 50.0
    # The cyclic GC's thresholds the Python sides run under (the JVM side has its own GC):
    # "interpreter" (CPython's defaults) or "service" (what `purgatory serve` sets while it
    # serves: admission.gc_thresholds). Every Python side of a run gets the same policy.
    gc: str = "interpreter"

    def validate(self) -> None:
        checks = [
            (self.num > 0, "--num must be > 0"),
            (self.rate >= 0, "--rate must be >= 0 (0: as fast as possible)"),
            (self.keys > 0, "--keys must be > 0"),
            (self.key_space_size > 0, "--key-space-size must be > 0"),
            (self.timeout > 0, "--timeout must be > 0 ms"),
            (self.pct50 > 0, "--pct50 must be > 0 ms"),
            (self.pct75 >= self.pct50, "--pct75 must be >= --pct50"),
            (self.gc in GC_POLICIES, f"--gc must be one of {', '.join(GC_POLICIES)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message} (got {self})")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def gc_thresholds(self) -> tuple[int, int, int] | None:
        """The thresholds the measured run sets, None: leave the interpreter's."""
        if self.gc == "service":
            thresholds: tuple[int, int, int] | None = AdmissionSettings().gc_thresholds
            assert thresholds is not None  # the service's default policy sets them
            return thresholds
        return None


# --gc: whose cyclic-GC policy the Python sides run under (PurgatoryParams.gc).
GC_POLICIES = ("interpreter", "service")


# The clocks the per-request code reads, bound once: the generator, the operation's constructor
# and its try_complete read them directly (a C call) rather than through a helper function
# (a Python frame each: three per request, ~0.1 µs each; docs/performance.md, issue 15).
_monotonic = time.monotonic


def _now_ms() -> float:
    return _monotonic() * 1000.0


def _clock_ms() -> int:
    # Whole milliseconds, the resolution of Kafka's tool (System.currentTimeMillis): requests due
    # in the same millisecond are completed in one wake-up of the completion thread. With a
    # float clock every request had its own due time, and the thread slept and woke (a futex
    # round trip and a GIL hand-off) about once per request: ~45k context switches per 100k
    # requests, 3-4 us of system CPU per request on either side, drowning what is compared.
    return time.monotonic_ns() // 1_000_000


class _Sink:
    """Counts finished requests from any thread (``next`` on itertools.count is atomic in
    CPython) and records expiry lateness; ``done`` is set when all have finished.

    Exactly once without holding every request (a list of all 100k requests kept them alive
    for the whole run, and every full GC walked them): each request counts its own finishes and
    reports a second one here. No repeats and ``total`` finishes counted means each request
    finished exactly once; a lost one leaves the count short.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        # Finishes so far, counted by ``next`` (also inline in _FakeBehaviour.on_complete).
        self.finishes = itertools.count(1)
        self._repeats = itertools.count(1)
        self.repeated = 0
        self.done = threading.Event()
        self.lateness_ms: list[float] = []

    def finished(self) -> None:
        if next(self.finishes) == self.total:
            self.done.set()

    def finished_again(self) -> None:
        self.repeated = next(self._repeats)

    def count(self) -> int:
        """Finishes so far (call once the run is over: it counts itself)."""
        return next(self.finishes) - 1


class _Fake(Protocol):
    latency_ms: int
    completes_at: int
    created_at: float
    delay_ms: int
    finishes: int
    sink: _Sink

    def force_complete(self) -> bool: ...


class _FakeBehaviour:
    """Kafka's FakeOperation, for either purgatory: completes once its latency has passed."""

    __slots__ = ()

    # The constructor's fields are set in each class's ``__init__`` (no shared helper: a Python
    # frame per request): latency_ms, created_at (float: expiry lateness is reported below
    # 1 ms), completes_at, sink, finishes.

    def try_complete(self: _Fake) -> bool:
        # Kafka's ``System.currentTimeMillis >= completesAt``. The clock in ms as a float: for a
        # whole ``completes_at``, ``t >= completes_at`` iff ``floor(t) >= completes_at`` (what
        # ``_clock_ms()`` compared), without the int division and the two ints it allocated
        # twice per request (~1% of an unpaced run, perf; docs/performance.md, issue 15).
        return _monotonic() * 1000.0 >= self.completes_at and self.force_complete()

    def on_complete(self: _Fake) -> None:
        # Kafka's onComplete is one latch.countDown(). The exactly-once check is ours: its count
        # is taken here, inline (``_Sink.finished``'s body), not through a method call, so the
        # check costs one Python frame less per request than it did (docs/performance.md,
        # issue 15). Identical for every side.
        self.finishes += 1
        sink = self.sink
        if self.finishes != 1:
            sink.finished_again()
        if next(sink.finishes) == sink.total:
            sink.done.set()

    def on_expiration(self: _Fake) -> None:
        self.sink.lateness_ms.append(_now_ms() - (self.created_at + self.delay_ms))


# Both operation classes are written the way the README writes an operation: ``__slots__`` for
# their fields, ``super().__init__(delay_ms)``, ``try_complete`` calling ``force_complete``. This
# bench measures what a user's operation costs, not a hand-tuned one: calling the compiled base
# constructor directly (``DelayedOperation.__init__(self, delay_ms)``, as this bench once did)
# saved ~0.1 µs per request; leaving ``__slots__`` out costs ~1.4 µs (an instance dict per
# operation: README, "Usage"). Identical for every side.
#
# FakeOperation and NaiveFakeOperation set the same fields in the same order, written out in
# each: a shared helper would add a Python frame per request to the measured window (the
# harness's cost is most of a request's, docs/performance.md); the two must stay identical.
class FakeOperation(_FakeBehaviour, DelayedOperation):
    __slots__ = ("completes_at", "created_at", "finishes", "latency_ms", "sink")

    def __init__(self, delay_ms: int, latency_ms: int, sink: _Sink) -> None:
        super().__init__(delay_ms)
        self.latency_ms = latency_ms
        self.created_at = created_at = _monotonic() * 1000.0
        self.completes_at = int(created_at) + latency_ms
        self.sink = sink
        self.finishes = 0


class NaiveFakeOperation(_FakeBehaviour, NaiveOperation):
    __slots__ = ("completes_at", "created_at", "finishes", "latency_ms", "sink")

    def __init__(self, delay_ms: int, latency_ms: int, sink: _Sink) -> None:
        super().__init__(delay_ms)
        self.latency_ms = latency_ms
        self.created_at = created_at = _monotonic() * 1000.0
        self.completes_at = int(created_at) + latency_ms
        self.sink = sink
        self.finishes = 0


class CompletionQueue:
    """Kafka's CompletionQueue: a thread force-completing each operation at its latency.

    Like Kafka's (a DelayQueue polled by one thread) it hands requests out at their due time,
    in due order, ties in arrival order; it works in whole milliseconds (Kafka's clock) and
    takes every request due by now in one hold of its lock, completing them outside it.

    The delay queue is keyed by due *millisecond*: a heap of the distinct due times pending
    (at most ``--timeout`` of them: only requests due before their timeout are queued), each with
    the list of its requests in arrival order. Adding a request is a dict lookup and a list
    append (a heap push only for a millisecond not pending yet); handing out a millisecond is one
    heap pop. A heap entry per request (Kafka's DelayQueue) made every add and every pop walk a
    ~30k-entry heap of separately allocated int keys: ``siftup``/``siftdown`` and the int
    comparisons were ~16% of the completion thread's CPU and ~8% of an unpaced run's
    (perf, docs/performance.md, issue 15), a cost of the harness's data structure, not of either
    purgatory. Identical for every side; every request is still queued and force-completed at
    its due millisecond by this thread.
    """

    def __init__(self) -> None:
        # Due millisecond -> the requests due then, in arrival order; the heap holds each key once.
        self._due: dict[int, list[_Fake]] = {}
        self._heap: list[int] = []
        # Held with ``with self._mutex`` (a C-level __enter__/__exit__), not ``with self._cond``:
        # Condition's __enter__ and __exit__ are Python methods, two frames per add.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="completion thread", daemon=True)
        self._thread.start()

    def add(self, op: _Fake) -> None:
        due = op.completes_at
        with self._mutex:
            requests = self._due.get(due)
            if requests is not None:
                requests.append(op)
                return
            self._due[due] = [op]
            heapq.heappush(self._heap, due)
            if self._heap[0] == due:
                self._cond.notify()  # a new earliest due time: the thread re-arms its wait

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _loop(self) -> None:
        heap = self._heap
        by_due = self._due
        ready: list[list[_Fake]] = []
        while True:
            with self._mutex:
                while True:
                    if self._closed:
                        return
                    now = _clock_ms()
                    while heap and heap[0] <= now:
                        ready.append(by_due.pop(heapq.heappop(heap)))
                    if ready:
                        break
                    self._cond.wait((heap[0] - now) / 1000.0 if heap else 0.1)
            for requests in ready:
                for op in requests:
                    op.force_complete()
            ready.clear()


def _latencies(rng: random.Random, params: PurgatoryParams) -> list[int]:
    # Log-normal fitted to the 50th and 75th percentiles (Kafka's LatencySamples).
    mu = math.log(params.pct50)
    sigma = (math.log(params.pct75) - mu) / NORMAL_75TH_PERCENTILE
    return [int(math.exp(rng.gauss(mu, sigma))) for _ in range(params.num)]


def _intervals(rng: random.Random, params: PurgatoryParams) -> list[int]:
    # Exponential inter-arrival times in whole ms, carrying the rounding residue (IntervalSamples).
    if params.rate <= 0:
        return [0] * params.num
    lam = params.rate / 1000.0
    out: list[int] = []
    residue = 0.0
    for _ in range(params.num):
        interval = -math.log(1.0 - rng.random()) / lam + residue
        whole = int(interval)
        residue = interval - whole
        out.append(whole)
    return out


def workload(params: PurgatoryParams, seed: int) -> tuple[list[int], list[int], list[str]]:
    """Latencies, arrival intervals and watch keys of a run: the same for every side (the JVM's too)."""
    rng = random.Random(seed)
    latencies = _latencies(rng, params)
    intervals = _intervals(rng, params)
    keys = [f"fakeKey{rng.randrange(params.key_space_size)}" for _ in range(params.keys)]
    return latencies, intervals, keys


def run_side(side: str, raw_params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Run the workload on one side in this process; Kafka's figures plus correctness checks."""
    params = PurgatoryParams(**raw_params)
    params.validate()
    latencies, intervals, keys = workload(params, seed)
    sink = _Sink(params.num)
    queue = CompletionQueue()
    if side == "purgatory":
        purgatory: Any = DelayedOperationPurgatory[FakeOperation]("fake purgatory")
        op_type: Any = FakeOperation
    elif side == "naive":
        purgatory = NaivePurgatory()
        op_type = NaiveFakeOperation
    else:
        raise ValueError(f"unknown purgatory side {side!r}; expected one of {SIDES}")
    timeout = params.timeout
    submit = purgatory.try_complete_else_watch
    failure: list[BaseException] = []
    arrival_box = [0.0]
    end_box = [0.0]

    def generate() -> None:
        arrival = start
        for i in range(params.num):
            arrival += intervals[i]
            latency = latencies[i]
            now = _monotonic() * 1000.0  # _now_ms(), inline
            if arrival > now:
                time.sleep((arrival - now) / 1000.0)
            op = op_type(timeout, latency, sink)
            # Kafka's order: queue the completion, then submit. The completion thread may finish
            # the request before (or while) it is submitted: try_complete_else_watch then keeps
            # nothing and returns False (it used to raise, issue 15).
            if latency < timeout:
                queue.add(op)
            submit(op, keys)
        arrival_box[0] = arrival
        end_box[0] = _now_ms()

    def generate_or_fail() -> None:
        try:
            generate()
        except BaseException as exc:
            failure.append(exc)
            sink.done.set()  # do not wait for requests that will never come
            raise

    gc.collect()
    thresholds_before = gc.get_threshold()
    thresholds = params.gc_thresholds()
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    try:
        with GcMeter() as meter:
            cpu0 = time.process_time()
            start = _now_ms()
            generator = threading.Thread(target=generate_or_fail, name="generator")
            generator.start()
            generator.join()
            finished = sink.done.wait(FINISH_TIMEOUT_S)
            done = _now_ms()
            cpu_ms = (time.process_time() - cpu0) * 1000.0
    finally:
        gc.set_threshold(*thresholds_before)
    queue.shutdown()
    purgatory.shutdown()
    if failure:
        raise AssertionError(f"{side}: the generator failed: {failure[0]!r}")
    if not finished:
        raise AssertionError(f"{side}: requests unfinished after {FINISH_TIMEOUT_S} s")
    # After both shutdowns: a request finishing late (twice, or drained) is counted too.
    finishes = sink.count()
    if sink.repeated or finishes != params.num:
        raise AssertionError(
            f"{side}: {params.num} requests, {finishes} finishes, {sink.repeated} of them repeats:"
            " not every request finished exactly once"
        )
    end = end_box[0]
    actual_rate = params.num * 1000.0 / max(end - start, 1e-9)
    target_rate = params.num * 1000.0 / (arrival_box[0] - start) if arrival_box[0] > start else math.inf
    lateness = sorted(sink.lateness_ms)
    return {
        "finished_exactly_once": finishes,
        "req_per_s": actual_rate,
        "elapsed_ms": done - start,
        "target_rate": target_rate,
        "actual_rate": actual_rate,
        "us_per_enqueue": 1e6 / actual_rate,
        "cpu_ms": cpu_ms,
        "cpu_us_per_request": cpu_ms * 1000.0 / params.num,
        "expired": len(lateness),
        "expiry_lateness_p50_ms": percentile(lateness, 0.5),
        "expiry_lateness_p99_ms": percentile(lateness, 0.99),
        "variant": _accel.status() if side == "purgatory" else "pure Python",
        "gc_thresholds": list(thresholds or thresholds_before),
        **meter.as_dict(),
    }


def comparisons(
    params: PurgatoryParams,
    seed: int,
    rates: Sequence[float] = DEFAULT_RATES,
    jvm: bool = False,
    pending: int = MEMORY_PENDING,
) -> list[Comparison]:
    """Per rate: CPU per request and enqueue time, from the same runs; then bytes per operation.

    Targets (issue 15; 1.5x since operations are written as the README writes them): at 100k/s
    >= 1.5x less CPU per request than the naive purgatory;
    unpaced >= 200k requests/s (<= 5 us per enqueue), every request finished exactly once (each
    run checks that itself and fails otherwise); <= 250 B per pending operation on 3 keys.
    """
    sides = [*SIDES, JVM_SIDE] if jvm else list(SIDES)
    out: list[Comparison] = []
    for rate in rates:
        point = replace(params, rate=rate)
        point.validate()
        specs = side_specs("purgatory", sides, point.as_dict(), seed)
        case = f"{point.num:,} requests, rate {'max' if rate <= 0 else f'{rate:g}/s'}"
        if point.gc != "interpreter":
            case += f", {point.gc} GC"
        cpu_targets = (
            [Target(">= 1.5x less CPU/request than naive at 100k/s", baseline="naive", min_ratio=1.5)]
            if rate == 100_000
            else []
        )
        cpu = Comparison(
            "purgatory", case, "cpu_us_per_request", "CPU µs/request", "purgatory", specs, cpu_targets
        )
        # Same runs, second figure: the enqueue rate as time per request (5 µs = 200k requests/s).
        enqueue_targets = [Target(">= 200k req/s unpaced (<= 5 µs/enqueue)", limit=5.0)] if rate <= 0 else []
        enqueue = Comparison(
            "purgatory", case, "us_per_enqueue", "µs/enqueue", "purgatory", specs, enqueue_targets
        )
        enqueue.runs = cpu.runs  # one set of runs, two figures
        out += [cpu, enqueue]
    if pending <= 0:
        raise ValueError(f"--pending must be > 0 (got {pending})")
    memory_params = {"pending": pending, "keys": params.keys, "key_space_size": params.key_space_size}
    memory = Comparison(
        "purgatory",
        f"{pending:,} pending, {params.keys} keys each",
        "bytes_per_op",
        "bytes/pending op",
        "purgatory",
        side_specs("purgatory_memory", sides, memory_params, seed),
        [Target("<= 250 B per pending operation", limit=250.0)],
    )
    return [*out, memory]


def run_memory_side(side: str, raw_params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Bytes per pending operation: ``pending`` payload-free operations, each watched on the same
    ``keys`` keys and timed (timeout 1 h, so none finishes), measured by tracemalloc.

    Counts everything the purgatory keeps per operation: the operation object and its lock, its
    watch-list entries, its timer entry, and any per-operation int or tuple the structures box.
    """
    import tracemalloc

    pending = int(raw_params["pending"])
    rng = random.Random(seed)
    keys = [
        f"fakeKey{rng.randrange(int(raw_params['key_space_size']))}" for _ in range(int(raw_params["keys"]))
    ]
    if side == "purgatory":
        purgatory: Any = DelayedOperationPurgatory[_IdleOperation]("memory purgatory")
        op_type: Any = _IdleOperation
    elif side == "naive":
        purgatory = NaivePurgatory()
        op_type = _NaiveIdleOperation
    else:
        raise ValueError(f"unknown purgatory side {side!r}; expected one of {SIDES}")
    hour_ms = 3_600_000
    warm = [op_type(hour_ms) for _ in range(1000)]  # first-use allocations (classes, caches) outside
    for op in warm:
        purgatory.try_complete_else_watch(op, keys)
    gc.collect()
    ops: list[Any] = [None] * pending  # the harness's own list, allocated before measuring
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(pending):
            op = op_type(hour_ms)
            purgatory.try_complete_else_watch(op, keys)
            ops[i] = op
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    op_size = sys.getsizeof(ops[0])
    lingering = purgatory.num_delayed()
    purgatory.shutdown()
    if lingering != pending + len(warm):
        raise AssertionError(f"{side}: {lingering} operations timed, expected {pending + len(warm)}")
    return {
        "bytes_per_op": (after - before) / pending,
        "op_object_bytes": op_size,
        "pending": pending,
        "variant": _accel.status() if side == "purgatory" else "pure Python",
    }


class _IdleOperation(DelayedOperation):
    """Payload-free: what the purgatory itself costs per operation."""

    __slots__ = ()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass


class _NaiveIdleOperation(NaiveOperation):
    __slots__ = ()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass


def print_kafka_lines(console: Console, comparisons: list[Comparison]) -> None:
    """What Kafka's tool prints, one line per run, side and rate; then bytes per operation."""
    console.print(
        "# <side> <elapsed time ms>\t<target rate>\t<actual rate>\t<process cpu time ms>\t"
        "<cpu us/request>\t<gen0 count> <gen1 count> <gen2 count>\t<gc time ms>\t<expired>\t"
        "<expiry lateness p99 ms>\t<finished exactly once>"
    )
    for comparison in comparisons:
        if comparison.metric != "cpu_us_per_request":
            continue
        console.print(f"# {comparison.case}", highlight=False)
        for side, side_runs in comparison.runs.items():
            for run in side_runs:
                counts = " ".join(str(c) for c in run["gc_counts"])
                console.print(
                    f"{side} {run['elapsed_ms']:.0f}\t{run['target_rate']:.2f}\t{run['actual_rate']:.2f}\t"
                    f"{run['cpu_ms']:.0f}\t{run['cpu_us_per_request']:.2f}\t{counts}\t{run['gc_ms']:.0f}\t"
                    f"{run['expired']}\t{run['expiry_lateness_p99_ms']:.1f}\t{run['finished_exactly_once']}",
                    highlight=False,
                )
    for comparison in comparisons:
        if comparison.metric != "bytes_per_op":
            continue
        console.print(
            f"# {comparison.case}: <side> <bytes per pending op> <op object bytes>", highlight=False
        )
        for side, side_runs in comparison.runs.items():
            for run in side_runs:
                console.print(f"{side} {run['bytes_per_op']:.1f}\t{run['op_object_bytes']}", highlight=False)
