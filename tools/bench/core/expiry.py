"""Expiry lateness: how late timers fire with many pending, while other threads add and cancel.

Each side keeps ``pending`` timers (delays uniform 1-60 s) while a load thread, every
millisecond, adds ``load_rate / 1000`` timers and cancels as many random pending ones (so the
pending count stays put), and adds one *probe* timer (delay uniform 10-500 ms). A probe records
``now - deadline`` when it runs, ``deadline`` being its exact add time plus its delay. The
lateness percentiles are over every probe added during ``duration`` seconds.

The wheel side is a ``SystemTimer`` driven by a reaper-like thread (``advance_clock(200)`` in a
loop), running tasks on its executor thread; the baseline is ``ThreadedHeapTimer``, which runs
tasks on its own timer thread. The wheel truncates deadlines to its 1 ms tick, so a probe may
fire up to 1 ms before its exact deadline (negative lateness).
"""

from __future__ import annotations

import gc
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from purgatory import _accel
from purgatory.timer import SystemTimer, TimerTask

from .._runner import Comparison, Target, side_specs
from ..measure import GcMeter, percentile
from .baselines import ThreadedHeapTimer

__all__ = ["ExpiryParams", "comparisons", "run_side"]

SIDES = ("wheel", "heap_tuple")
PENDING_DELAY_MS = (1_000, 60_000)
PROBE_DELAY_MS = (10, 500)
PROBES_PER_MS = 1
SETTLE_S = 2.0  # after the window: time for the last probes (<= 500 ms) to fire


@dataclass(frozen=True)
class ExpiryParams:
    pending: int = 100_000
    duration: float = 5.0
    load_rate: int = 20_000

    def validate(self) -> None:
        if self.pending < 0:
            raise ValueError(f"--pending must be >= 0, got {self.pending}")
        if self.duration <= 0:
            raise ValueError(f"--duration must be > 0 s, got {self.duration}")
        if self.load_rate < 0:
            raise ValueError(f"--load-rate must be >= 0, got {self.load_rate}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class _Recorder:
    def __init__(self) -> None:
        self.lateness_ms: list[float] = []


class _WheelProbe(TimerTask):
    __slots__ = ("deadline", "recorder")

    def __init__(self, delay_ms: int, recorder: _Recorder | None) -> None:
        super().__init__(delay_ms)
        self.deadline = _now_ms() + delay_ms
        self.recorder = recorder

    def run(self) -> None:
        if self.recorder is not None:
            self.recorder.lateness_ms.append(_now_ms() - self.deadline)


class _HeapProbe:
    __slots__ = ("deadline", "delay_ms", "recorder")

    def __init__(self, delay_ms: int, recorder: _Recorder | None) -> None:
        self.delay_ms = delay_ms
        self.deadline = _now_ms() + delay_ms
        self.recorder = recorder

    def run(self) -> None:
        if self.recorder is not None:
            self.recorder.lateness_ms.append(_now_ms() - self.deadline)


def run_side(side: str, raw_params: dict[str, Any], seed: int) -> dict[str, Any]:
    params = ExpiryParams(**raw_params)
    params.validate()
    rng = random.Random(seed)
    recorder = _Recorder()
    stop = threading.Event()
    driver: threading.Thread | None = None
    if side == "wheel":
        timer = SystemTimer("bench-expiry")
        make: Any = _WheelProbe

        def drive() -> None:
            while not stop.is_set():
                timer.advance_clock(200)

        driver = threading.Thread(target=drive, name="bench-expiry-driver", daemon=True)
        driver.start()

        def add(task: Any) -> Any:
            timer.add(task)
            return task

        cancel: Any = TimerTask.cancel
        size: Any = timer.size

        def close() -> None:
            stop.set()
            timer.wakeup()
            assert driver is not None
            driver.join()
            timer.close()

    elif side == "heap_tuple":
        heap = ThreadedHeapTimer("bench-expiry-heap")
        make = _HeapProbe
        add, cancel, size, close = heap.add, heap.cancel, heap.size, heap.close
    else:
        raise ValueError(f"unknown expiry side {side!r}; expected one of {SIDES}")

    low, high = PENDING_DELAY_MS
    handles = [add(make(rng.randint(low, high), None)) for _ in range(params.pending)]
    per_ms = params.load_rate / 1000.0
    gc.collect()
    probes = 0
    with GcMeter() as meter:
        cpu0 = time.process_time()
        start = _now_ms()
        end = start + params.duration * 1000.0
        credit = 0.0
        tick = start
        while True:
            now = _now_ms()
            if now >= end:
                break
            if now < tick:
                time.sleep((tick - now) / 1000.0)
            tick += 1.0
            credit += per_ms
            while credit >= 1.0 and handles:
                credit -= 1.0
                j = rng.randrange(len(handles))
                cancel(handles[j])
                handles[j] = add(make(rng.randint(low, high), None))
            for _ in range(PROBES_PER_MS):
                add(make(rng.randint(*PROBE_DELAY_MS), recorder))
                probes += 1
        pending_end = size()
        cpu_s = time.process_time() - cpu0
    deadline = time.monotonic() + SETTLE_S
    while len(recorder.lateness_ms) < probes and time.monotonic() < deadline:
        time.sleep(0.01)  # bench only: wait for the last probes (bounded by SETTLE_S)
    close()
    lateness = sorted(recorder.lateness_ms)
    if len(lateness) < probes:
        raise AssertionError(f"{side}: only {len(lateness)} of {probes} probes fired")
    return {
        "probes": probes,
        "pending_end": pending_end,
        "lateness_p50_ms": percentile(lateness, 0.50),
        "lateness_p99_ms": percentile(lateness, 0.99),
        "lateness_max_ms": lateness[-1] if lateness else float("nan"),
        "cpu_s": cpu_s,
        "variant": _accel.status() if side == "wheel" else "pure Python",
        **meter.as_dict(),
    }


def comparisons(params: ExpiryParams, seed: int) -> list[Comparison]:
    sides = side_specs("expiry", SIDES, params.as_dict(), seed)
    case = f"{params.pending:,} pending, {params.load_rate:,} adds+cancels/s, {params.duration:g} s"
    p99 = Comparison(
        "expiry",
        case,
        "lateness_p99_ms",
        "p99 lateness ms",
        "wheel",
        sides,
        [Target("p99 <= 5 ms", limit=5.0)],
    )
    p50 = Comparison("expiry", case, "lateness_p50_ms", "p50 lateness ms", "wheel", sides)
    worst = Comparison("expiry", case, "lateness_max_ms", "max lateness ms", "wheel", sides)
    p50.runs = p99.runs  # one set of runs, three figures
    worst.runs = p99.runs
    return [p99, p50, worst]
