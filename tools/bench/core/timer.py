"""Timer benchmarks: the timing wheel against heapq timers, on identical inputs.

Workloads (docs/performance.md; delays uniform in 1-30,000 ms, simulated clock, seeded inputs
identical for every side; task objects are created before the clock starts, as a user's
requests exist before they are timed). W1-W3 are single-threaded and timed in process CPU time
(``time.process_time``, GC included): on a shared, loaded machine wall time also counts the time
the process waited for a core, which made same-run ratios swing 1x-4x; CPU time does not (the
wall time is recorded next to it):

* ``W1`` add N timers, then cancel 99% of them (random order) — a purgatory's usual life.
* ``W2`` add N timers and let all expire while the clock advances in random 1-200 ms steps.
* ``W3`` steady state: N pending; ``iterations`` times add one and cancel a random pending one,
  advancing the clock 1 ms every 100 iterations.
* ``memory`` bytes per pending timer (tracemalloc): what N pending timers cost beyond N bare
  task objects (a slotted object holding the delay), including any handle a user must keep to
  cancel (the heap's entries; a wheel task is its own handle).
* ``e2e`` real time, real threads: add N (delays uniform over 1 s from max(1 s, 15 ms per 1,000
  timers), so that no timer is due before the cancels are done), cancel 95%, wait until
  the rest has fired; process CPU from the first add until the last fire, and every task checked
  to have run exactly once (cancelled ones never).

Sides: ``wheel`` (this project; compiled or pure, whichever ``purgatory._accel`` chose),
``heap_tuple`` and ``asyncio_heap`` (``purgatory.tools.bench.core.baselines``).
"""

from __future__ import annotations

import gc
import random
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, Protocol

from purgatory import _accel
from purgatory.testing import MockTime, MockTimer
from purgatory.timer import SystemTimer, TimerTask

from .._runner import PURE_SUFFIX, Comparison, SideSpec, Target, side_env
from ..measure import GcMeter
from .baselines import AsyncioHeapTimer, HeapTimer, ThreadedHeapTimer

__all__ = ["SIDES", "WORKLOADS", "comparisons", "run_workload"]

SIDES = ("wheel", "heap_tuple", "asyncio_heap")
WORKLOADS = ("W1", "W2", "W3", "memory", "e2e")
E2E_SIDES = ("wheel", "heap_tuple")  # asyncio's heap has no thread of its own to compare

MAX_DELAY_MS = 30_000  # docs/performance.md: delays uniform in 1-30,000 ms
CANCEL_FRACTION_W1 = 0.99
CANCEL_FRACTION_E2E = 0.95
MAX_STEP_MS = 200  # W2: the clock advances in 1-200 ms steps
W3_ADVANCE_EVERY = 100  # W3: 1 ms of clock per 100 add+cancel iterations
E2E_MIN_DELAY_MS = 1_000  # long enough for the add+cancel phase to finish before any timer is due
E2E_DELAY_SPREAD_MS = 1_000
E2E_MS_PER_TIMER = 0.015  # ... and for big N: 15 ms per 1,000 timers (15 s at 1M; the heap's
# add+cancel phase took 9 s at 1M on a loaded 2-core machine)
E2E_TIMEOUT_S = 120.0


class WheelTask(TimerTask):
    """The wheel side's task; ``fired`` counts runs (only ever touched by the running thread)."""

    __slots__ = ("fired",)

    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.fired = 0

    def run(self) -> None:
        self.fired += 1


class HeapTask:
    """The heap sides' task: the same payload, no timer machinery."""

    __slots__ = ("delay_ms", "fired")

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.fired = 0

    def run(self) -> None:
        self.fired += 1


BareTask = HeapTask  # what a user's task costs without any timer: the memory baseline


class _Side:
    """One implementation under the same driver: how to make tasks, add, cancel, advance."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "wheel":
            timer = MockTimer(MockTime(0))
            self.new_task: Callable[[int], Any] = WheelTask
            self.add: Callable[[Any], Any] = timer.add
            self.cancel: Callable[[Any], None] = TimerTask.cancel  # the task is its own handle
            self.advance: Callable[[int], Any] = timer.advance_clock
            self.size: Callable[[], int] = timer.size
            self.handle_is_task = True
        elif name in ("heap_tuple", "asyncio_heap"):
            heap = HeapTimer() if name == "heap_tuple" else AsyncioHeapTimer()
            self.new_task = HeapTask
            self.add = heap.add
            self.cancel = heap.cancel
            self.advance = heap.advance_clock
            self.size = heap.size
            self.handle_is_task = False
        else:
            raise ValueError(f"unknown timer side {name!r}; expected one of {SIDES}")


def _delays(rng: random.Random, n: int, low: int = 1, high: int = MAX_DELAY_MS) -> list[int]:
    return [rng.randint(low, high) for _ in range(n)]


def _add_all(side: _Side, tasks: list[Any]) -> list[Any]:
    add = side.add
    if side.handle_is_task:
        for task in tasks:
            add(task)
        return tasks
    return [add(task) for task in tasks]


def _w1(side: _Side, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    tasks = [side.new_task(d) for d in _delays(rng, n)]
    cancel_order = rng.sample(range(n), int(n * CANCEL_FRACTION_W1))
    cancel = side.cancel
    gc.collect()
    with GcMeter() as meter:
        start, wall = time.process_time(), time.perf_counter()
        handles = _add_all(side, tasks)
        for i in cancel_order:
            cancel(handles[i])
        seconds, wall = time.process_time() - start, time.perf_counter() - wall
    pending = side.size()
    expected = n - len(cancel_order)
    if pending != expected:
        raise AssertionError(f"{side.name}: {pending} pending after W1, expected {expected}")
    return {"seconds": seconds, "wall_s": wall, "ns_per_timer": seconds * 1e9 / n, **meter.as_dict()}


def _w2(side: _Side, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    tasks = [side.new_task(d) for d in _delays(rng, n)]
    steps = [rng.randint(1, MAX_STEP_MS) for _ in range(1024)]
    advance = side.advance
    size = side.size
    gc.collect()
    with GcMeter() as meter:
        start, wall = time.process_time(), time.perf_counter()
        _add_all(side, tasks)
        i = 0
        while size() > 0:
            advance(steps[i & 1023])
            i += 1
        seconds, wall = time.process_time() - start, time.perf_counter() - wall
    not_once = sum(1 for t in tasks if t.fired != 1)
    if not_once:
        raise AssertionError(f"{side.name}: {not_once} timers did not fire exactly once in W2")
    return {
        "seconds": seconds,
        "wall_s": wall,
        "ns_per_timer": seconds * 1e9 / n,
        "advances": i,
        **meter.as_dict(),
    }


def _w3(side: _Side, n: int, seed: int, iterations: int) -> dict[str, Any]:
    rng = random.Random(seed)
    live = _add_all(side, [side.new_task(d) for d in _delays(rng, n)])
    new_tasks = [side.new_task(d) for d in _delays(rng, iterations)]
    victims = [rng.randrange(n) for _ in range(iterations)]
    add, cancel, advance = side.add, side.cancel, side.advance
    handle_is_task = side.handle_is_task
    gc.collect()
    with GcMeter() as meter:
        start, wall = time.process_time(), time.perf_counter()
        for i in range(iterations):
            task = new_tasks[i]
            handle = add(task)
            j = victims[i]
            cancel(live[j])
            live[j] = task if handle_is_task else handle
            if i % W3_ADVANCE_EVERY == W3_ADVANCE_EVERY - 1:
                advance(1)
        seconds, wall = time.process_time() - start, time.perf_counter() - wall
    return {
        "seconds": seconds,
        "wall_s": wall,
        "ns_per_timer": seconds * 1e9 / iterations,
        "pending_end": side.size(),
        **meter.as_dict(),
    }


def _memory(side: _Side, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    delays = _delays(rng, n)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tasks = [side.new_task(d) for d in delays]
        handles = _add_all(side, tasks)
        with_timers = tracemalloc.get_traced_memory()[0]
        bare = [BareTask(d) for d in delays]
        with_bare = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    bare_bytes = with_bare - with_timers
    timer_bytes = with_timers - base - bare_bytes
    del tasks, handles, bare
    return {"bytes_per_timer": timer_bytes / n, "bare_task_bytes": bare_bytes / n}


class _Countdown:
    """Counts fires; sets ``done`` at zero. Fires come from one thread per timer (its runner)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.done = threading.Event()
        if count <= 0:
            self.done.set()

    def fired(self) -> None:
        self.count -= 1
        if self.count == 0:
            self.done.set()


class _Counting(Protocol):
    fired: int
    countdown: _Countdown


class _CountingRun:
    """``run`` for the e2e tasks: count the fire on the task and on the shared countdown."""

    __slots__ = ()

    def run(self: _Counting) -> None:
        self.fired += 1
        self.countdown.fired()


class _E2EWheelTask(_CountingRun, WheelTask):
    __slots__ = ("countdown",)

    def __init__(self, delay_ms: int, countdown: _Countdown) -> None:
        super().__init__(delay_ms)
        self.countdown = countdown


class _E2EHeapTask(_CountingRun, HeapTask):
    __slots__ = ("countdown",)

    def __init__(self, delay_ms: int, countdown: _Countdown) -> None:
        super().__init__(delay_ms)
        self.countdown = countdown


def _e2e(side_name: str, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    min_delay = max(E2E_MIN_DELAY_MS, int(n * E2E_MS_PER_TIMER))
    delays = _delays(rng, n, min_delay, min_delay + E2E_DELAY_SPREAD_MS)
    cancel_order = rng.sample(range(n), int(n * CANCEL_FRACTION_E2E))
    countdown = _Countdown(n - len(cancel_order))
    stop = threading.Event()
    driver: threading.Thread | None = None
    if side_name == "wheel":
        timer = SystemTimer("bench-e2e")
        tasks: list[Any] = [_E2EWheelTask(d, countdown) for d in delays]

        def drive() -> None:  # what the purgatory's reaper does
            while not stop.is_set():
                timer.advance_clock(200)

        driver = threading.Thread(target=drive, name="bench-e2e-driver", daemon=True)
        add: Callable[[Any], Any] = timer.add
        cancel: Callable[[Any], None] = TimerTask.cancel
        close: Callable[[], None] = timer.close
        wakeup: Callable[[], None] = timer.wakeup
        handle_is_task = True
    elif side_name == "heap_tuple":
        heap = ThreadedHeapTimer("bench-e2e-heap")
        tasks = [_E2EHeapTask(d, countdown) for d in delays]
        add, cancel, close = heap.add, heap.cancel, heap.close
        wakeup = lambda: None  # noqa: E731
        handle_is_task = False
    else:
        raise ValueError(f"e2e compares {E2E_SIDES}, not {side_name!r}")
    gc.collect()
    with GcMeter() as meter:
        cpu0 = time.process_time()
        wall0 = time.perf_counter()
        if driver is not None:
            driver.start()
        if handle_is_task:
            for task in tasks:
                add(task)
            handles = tasks
        else:
            handles = [add(task) for task in tasks]
        for i in cancel_order:
            cancel(handles[i])
        submit_s = time.perf_counter() - wall0
        finished = countdown.done.wait(E2E_TIMEOUT_S)
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
    stop.set()
    wakeup()
    if driver is not None:
        driver.join()
    close()
    if not finished:
        raise AssertionError(f"{side_name}: {countdown.count} timers had not fired after {E2E_TIMEOUT_S} s")
    if submit_s * 1000.0 >= min_delay:
        raise AssertionError(f"{side_name}: adding and cancelling took {submit_s:.2f} s; raise E2E delays")
    cancelled = set(cancel_order)
    wrong = sum(1 for i, t in enumerate(tasks) if t.fired != (0 if i in cancelled else 1))
    if wrong:
        raise AssertionError(
            f"{side_name}: {wrong} timers did not fire exactly once (or fired when cancelled)"
        )
    return {
        "cpu_s": cpu,
        "cpu_us_per_timer": cpu * 1e6 / n,
        "wall_s": wall,
        "submit_s": submit_s,
        **meter.as_dict(),
    }


def run_workload(workload: str, side: str, n: int, seed: int, iterations: int = 200_000) -> dict[str, Any]:
    """Run one workload for one side in this process; the figures as a dict."""
    if workload == "e2e":
        result = _e2e(side, n, seed)
    else:
        s = _Side(side)
        if workload == "W1":
            result = _w1(s, n, seed)
        elif workload == "W2":
            result = _w2(s, n, seed)
        elif workload == "W3":
            result = _w3(s, n, seed, iterations)
        elif workload == "memory":
            result = _memory(s, n, seed)
        else:
            raise ValueError(f"unknown timer workload {workload!r}; expected one of {WORKLOADS}")
    result["variant"] = _accel.status() if side == "wheel" else "pure Python"
    return result


# -- comparisons (what ``purgatory bench timer`` runs) ----------------------------------------

TIMER_TARGETS = {
    "W1": [Target("W1 >= 2x heap_tuple", baseline="heap_tuple", min_ratio=2.0)],
    "W2": [Target("W2 >= 1.5x heap_tuple", baseline="heap_tuple", min_ratio=1.5)],
    "W3": [Target("W3 >= 1.5x heap_tuple", baseline="heap_tuple", min_ratio=1.5)],
    "memory": [Target("<= 120 B/timer", limit=120.0)],
    "e2e": [Target("e2e >= 1.5x less CPU than heap_tuple", baseline="heap_tuple", min_ratio=1.5)],
}
_METRICS = {
    "W1": ("ns_per_timer", "CPU ns/timer"),
    "W2": ("ns_per_timer", "CPU ns/timer"),
    "W3": ("ns_per_timer", "CPU ns/iteration"),
    "memory": ("bytes_per_timer", "bytes/timer"),
    "e2e": ("cpu_us_per_timer", "CPU µs/timer"),
}


def comparisons(
    ns: list[int], workloads: list[str], sides: list[str], seed: int, iterations: int
) -> list[Comparison]:
    """One comparison per (workload, N); the wheel is the subject, the other sides baselines."""
    out: list[Comparison] = []
    for workload in workloads:
        if workload not in WORKLOADS:
            raise ValueError(f"unknown timer workload {workload!r}; expected some of {WORKLOADS}")
        metric, unit = _METRICS[workload]
        for n in ns:
            specs = []
            for name in sides:
                base = name.removesuffix(PURE_SUFFIX)
                if base not in SIDES:
                    raise ValueError(f"unknown side {name!r}; expected some of {SIDES} (or <side>_pure)")
                if workload == "e2e" and base not in E2E_SIDES:
                    continue
                spec = {"bench": "timer", "workload": workload, "side": base, "n": n, "seed": seed}
                if workload == "W3":
                    spec["iterations"] = iterations
                specs.append(SideSpec(name, spec, side_env(name)))
            case = f"{workload} N={n:,}" + (f" ({iterations:,} iterations)" if workload == "W3" else "")
            out.append(Comparison("timer", case, metric, unit, "wheel", specs, TIMER_TARGETS[workload]))
    return out
