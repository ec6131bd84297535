"""Benchmarks: the baselines are correct timers, every workload checks itself, the CLI writes its
results. Tiny sizes only — the figures themselves are checked by running ``purgatory bench``."""

from __future__ import annotations

import gc
import json
import math
import threading
from pathlib import Path

import pytest
from purgatory.adapters.service.settings import AdmissionSettings
from purgatory.tools.bench import Comparison, SideSpec, Target
from purgatory.tools.bench.core import expiry, purgatory_perf, timer
from purgatory.tools.bench.core.baselines import (
    AsyncioHeapTimer,
    HeapTimer,
    NaiveOperation,
    NaivePurgatory,
    ThreadedHeapTimer,
)
from typer.testing import CliRunner

from purgatory.cli import app

_Task = timer.HeapTask  # a task with a payload and a run counter, no timer machinery


@pytest.mark.parametrize("heap_type", [HeapTimer, AsyncioHeapTimer])
def test_heap_baselines_fire_live_timers_once_and_compact_cancelled_ones(heap_type: type) -> None:
    heap = heap_type()
    tasks = [_Task(d) for d in range(1, 1001)]
    handles = [heap.add(t) for t in tasks]
    cancelled = set(range(0, 1000, 2)) | set(range(1, 20, 2))  # 510 of 1000: more than half
    for i in sorted(cancelled):
        heap.cancel(handles[i])
    heap.cancel(handles[0])  # twice: harmless
    assert heap.size() == 490
    assert len(heap._heap) < 1000, "more than half cancelled: the heap was rebuilt (asyncio's rule)"
    heap.advance_clock(1000)
    assert [t.fired for t in tasks] == [0 if i in cancelled else 1 for i in range(1000)]
    heap.cancel(handles[21])  # cancelling a timer that already ran changes nothing
    assert heap.size() == 0


def test_threaded_heap_timer_runs_due_tasks_on_its_thread() -> None:
    heap = ThreadedHeapTimer("test-heap")
    done = threading.Event()

    class Task(_Task):
        __slots__ = ()

        def run(self) -> None:
            super().run()
            done.set()

    cancelled = Task(1)
    heap.cancel(heap.add(cancelled))
    kept = Task(5)
    heap.add(kept)
    try:
        assert done.wait(5), "a due task runs"
    finally:
        heap.close()
    assert (kept.fired, cancelled.fired) == (1, 0)


def test_naive_purgatory_finishes_each_operation_once() -> None:
    purgatory = NaivePurgatory(purge_interval=2)
    finished: list[str] = []

    class Op(NaiveOperation):
        __slots__ = ("name", "ready")

        def __init__(self, name: str, delay_ms: int) -> None:
            super().__init__(delay_ms)
            self.name, self.ready = name, False

        def try_complete(self) -> bool:
            return self.ready and self.force_complete()

        def on_complete(self) -> None:
            finished.append(self.name)

    a, b, expiring = Op("a", 60_000), Op("b", 60_000), Op("expiring", 1)
    try:
        for op in (a, b, expiring):
            assert purgatory.try_complete_else_watch(op, ["k1", "k2"]) is False
        a.ready = True
        assert purgatory.check_and_complete("k1") == 1
        assert purgatory.check_and_complete("k2") == 0
        assert b.force_complete() and not b.force_complete()
        deadline = threading.Event()
        for _ in range(500):
            if "expiring" in finished:
                break
            deadline.wait(0.01)
    finally:
        purgatory.shutdown()
    assert sorted(finished) == ["a", "b", "expiring"]


@pytest.mark.parametrize("workload", ["W1", "W2", "W3", "memory"])
@pytest.mark.parametrize("side", timer.SIDES)
def test_timer_workloads_check_themselves_on_every_side(workload: str, side: str) -> None:
    result = timer.run_workload(workload, side, 3000, seed=7, iterations=2000)
    figure = result["bytes_per_timer" if workload == "memory" else "ns_per_timer"]
    assert figure > 0 and math.isfinite(figure)


@pytest.mark.parametrize("side", timer.E2E_SIDES)
def test_end_to_end_timer_run_fires_the_uncancelled_exactly_once(side: str) -> None:
    result = timer.run_workload("e2e", side, 400, seed=3)
    assert result["cpu_s"] > 0 and result["wall_s"] >= timer.E2E_MIN_DELAY_MS / 1000.0


@pytest.mark.parametrize("side", purgatory_perf.SIDES)
def test_purgatory_performance_port_finishes_every_request_once(side: str) -> None:
    params = purgatory_perf.PurgatoryParams(num=1500, timeout=50, pct50=5, pct75=20)
    result = purgatory_perf.run_side(side, params.as_dict(), seed=5)
    assert 0 < result["expired"] < 1500, "some requests complete, the slow ones expire"
    assert result["actual_rate"] > 0 and result["target_rate"] == math.inf


class _Due:
    """What the completion queue needs of a request: its due time and force_complete."""

    def __init__(self, completes_at: int, log: list[_Due], done: threading.Event, total: int) -> None:
        self.completes_at = completes_at
        self.completed = 0
        self._log, self._done, self._total = log, done, total

    def force_complete(self) -> bool:
        self.completed += 1
        self._log.append(self)
        if len(self._log) == self._total:
            self._done.set()
        return True


def test_completion_queue_completes_each_request_once_in_due_order() -> None:
    # Keyed by due millisecond, each with its requests in arrival order: due order, ties in
    # arrival order, each request handed out once, however the adds interleave with the thread.
    now = purgatory_perf._clock_ms()
    log: list[_Due] = []
    done = threading.Event()
    offsets = [30, 5, 5, 0, 17, 30, 2, 9, 0, 12]
    ops = [_Due(now + off, log, done, len(offsets)) for off in offsets]
    queue = purgatory_perf.CompletionQueue()
    try:
        for op in ops:
            queue.add(op)
        assert done.wait(10), f"{len(log)} of {len(ops)} completed"
    finally:
        queue.shutdown()
    assert [op.completed for op in ops] == [1] * len(ops)
    assert log == sorted(ops, key=lambda op: (op.completes_at, ops.index(op)))


@pytest.mark.parametrize("side", purgatory_perf.SIDES)
def test_purgatory_memory_run_measures_bytes_per_pending_operation(side: str) -> None:
    result = purgatory_perf.run_memory_side(side, {"pending": 2000, "keys": 3, "key_space_size": 100}, seed=5)
    assert 64 < result["bytes_per_op"] < 4000, result
    assert result["op_object_bytes"] > 0


def test_purgatory_bench_has_a_point_per_rate_and_a_memory_figure() -> None:
    params = purgatory_perf.PurgatoryParams(num=1000)
    comparisons = purgatory_perf.comparisons(params, seed=1, rates=[100_000, 0], jvm=True)
    assert [(c.case, c.metric) for c in comparisons] == [
        ("1,000 requests, rate 100000/s", "cpu_us_per_request"),
        ("1,000 requests, rate 100000/s", "us_per_enqueue"),
        ("1,000 requests, rate max", "cpu_us_per_request"),
        ("1,000 requests, rate max", "us_per_enqueue"),
        ("100,000 pending, 3 keys each", "bytes_per_op"),
    ]
    assert [side.name for side in comparisons[0].sides] == ["purgatory", "naive", "jvm"]
    assert [t.min_ratio for t in comparisons[0].targets] == [1.5], "CPU target at 100k/s"
    assert [t.limit for t in comparisons[3].targets] == [5.0], "200k req/s unpaced"
    assert [t.limit for t in comparisons[4].targets] == [250.0]


def test_purgatory_params_refuse_nonsense_naming_the_option() -> None:
    with pytest.raises(ValueError, match="--pct75"):
        purgatory_perf.PurgatoryParams(pct50=50, pct75=20).validate()
    with pytest.raises(ValueError, match="--gc must be one of interpreter, service"):
        purgatory_perf.PurgatoryParams(gc="off").validate()


@pytest.mark.parametrize("side", purgatory_perf.SIDES)
def test_the_service_gc_policy_holds_for_the_timed_run_only(side: str) -> None:
    # --gc service: every Python side's timed run under the service's thresholds (what
    # `purgatory serve` sets), the interpreter's restored afterwards; the case says which.
    before = gc.get_threshold()
    params = purgatory_perf.PurgatoryParams(num=500, timeout=50, pct50=5, pct75=20, gc="service")
    result = purgatory_perf.run_side(side, params.as_dict(), seed=5)
    assert tuple(result["gc_thresholds"]) == AdmissionSettings().gc_thresholds != before
    assert gc.get_threshold() == before
    [cpu, *_] = purgatory_perf.comparisons(params, seed=1, rates=[0])
    assert cpu.case == "500 requests, rate max, service GC"


@pytest.mark.parametrize("side", expiry.SIDES)
def test_expiry_run_measures_every_probe(side: str) -> None:
    result = expiry.run_side(
        side, expiry.ExpiryParams(pending=2000, duration=0.3, load_rate=2000).as_dict(), 1
    )
    assert result["probes"] >= 100
    assert result["lateness_p50_ms"] <= result["lateness_p99_ms"] <= result["lateness_max_ms"]


def test_comparison_reports_medians_same_run_ratios_and_verdicts() -> None:
    sides = [SideSpec("wheel", {}), SideSpec("heap", {})]
    comparison = Comparison(
        "timer", "W1", "ns", "ns/timer", "wheel", sides, [Target("2x", baseline="heap", min_ratio=2.0)]
    )
    comparison.runs = {
        "wheel": [{"ns": 100}, {"ns": 200}, {"ns": 100}],
        "heap": [{"ns": 300}, {"ns": 300}, {"ns": 150}],
    }
    assert comparison.median("wheel") == 100
    assert comparison.ratios("heap") == [3.0, 1.5, 1.5]
    assert comparison.ratio("heap") == 1.5, "the median of same-run ratios, not a ratio of medians"
    [(_, value, met)] = comparison.verdicts()
    assert (value, met) == (1.5, False)


def test_bench_timer_cli_runs_each_side_in_a_subprocess_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = CliRunner().invoke(
        app,
        ["bench", "timer", "-n", "2000", "-r", "2", "-w", "W1", "-w", "memory", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "W1 N=2,000" in result.output
    [path] = list(out.glob("timer-*.json"))
    data = json.loads(path.read_text())
    [w1, memory] = data["comparisons"]
    assert set(w1["runs"]) == {"wheel", "heap_tuple", "asyncio_heap"}
    assert all(len(runs) == 2 for runs in w1["runs"].values()), "every side ran once per repeat"
    assert memory["medians"]["wheel"] > 0
    assert data["environment"]["purgatory_variant"]


def test_bench_purgatory_cli_runs_each_rate_and_the_memory_case(tmp_path: Path) -> None:
    args = ["bench", "purgatory", "--num", "400", "--rate", "0", "--rate", "20000", "--pending", "500"]
    result = CliRunner().invoke(app, [*args, "--timeout", "50", "-r", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [path] = list(tmp_path.glob("purgatory-*.json"))
    comparisons = json.loads(path.read_text())["comparisons"]
    assert [c["case"] for c in comparisons] == [
        "400 requests, rate max",
        "400 requests, rate max",
        "400 requests, rate 20000/s",
        "400 requests, rate 20000/s",
        "500 pending, 3 keys each",
    ]
    runs = comparisons[0]["runs"]
    assert {side: [r["finished_exactly_once"] for r in rs] for side, rs in runs.items()} == {
        "purgatory": [400],
        "naive": [400],
    }
    assert "naive" in result.output and "bytes/pending op" in result.output


def test_bench_cli_refuses_an_unknown_workload() -> None:
    result = CliRunner().invoke(app, ["bench", "timer", "-w", "W9"])
    assert result.exit_code != 0
    assert "W9" in result.output


def test_figures_of_the_same_runs_are_measured_once(tmp_path: Path) -> None:
    """p99, p50 and max lateness come from one set of runs: each side runs once per repeat."""
    args = ["bench", "expiry", "--pending", "500", "--duration", "0.2", "--load-rate", "500", "-r", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [path] = list(tmp_path.glob("expiry-*.json"))
    comparisons = json.loads(path.read_text())["comparisons"]
    assert [c["metric"] for c in comparisons] == ["lateness_p99_ms", "lateness_p50_ms", "lateness_max_ms"]
    assert {side: len(runs) for side, runs in comparisons[0]["runs"].items()} == {"wheel": 1, "heap_tuple": 1}


def test_request_reply_bench_counts_cpu_over_the_paced_requests_only() -> None:
    """A side's set-up (topic, tail, consumer) differs between the sides: its CPU is not the run's."""
    import asyncio
    import os
    import time

    from purgatory.tools.bench.measure import GcMeter
    from purgatory.tools.bench.reply import request_reply

    async def costly_start() -> None:
        spent = time.process_time() + 0.3
        while time.process_time() < spent:  # 300 ms of set-up CPU
            pass

    async def request() -> None:
        await asyncio.sleep(0)

    latencies, timeouts, sent, _, cpu = request_reply._drive(
        GcMeter(), costly_start, request, 100.0, 0.0, 0.2, ([os.getpid()], [])
    )
    request_reply._thaw()
    assert (len(latencies), timeouts, sent) == (20, 0, 20)
    assert cpu.requester < 0.15, cpu  # 20 paced requests, not the 300 ms start
    assert cpu.broker_gc == (0, 0.0), "no broker named: no pauses counted"


def test_request_reply_bench_counts_no_broker_gc_for_a_process_that_is_not_a_jvm() -> None:
    import os

    from purgatory.tools.bench.reply import request_reply

    assert request_reply._broker_gc([os.getpid()]) == (0, 0.0)


def test_request_reply_bench_counts_no_jit_cpu_for_a_process_that_is_not_a_jvm() -> None:
    import os

    from purgatory.tools.bench.reply import request_reply

    assert request_reply._jit_cpu_s([os.getpid()]) == 0.0, "a Python process has no C1/C2 threads"
    assert request_reply._jit_cpu_s([2**22 + 12345]) == 0.0, "a process gone counts 0"


def test_request_reply_bench_places_the_request_and_reply_leaders_on_different_brokers() -> None:
    """Fixed leaders (first replica): requests on the second broker, reply partition 0 on the third,
    the controller (the first) leads neither hot partition; every partition on every broker."""
    from purgatory.tools.bench.reply import request_reply

    ids = [1, 2, 3]
    [requests] = request_reply._placement(ids, 1, request_reply.REQUEST_LEADER_INDEX)
    replies = request_reply._placement(ids, 2, request_reply.REQUEST_LEADER_INDEX + 1)
    assert requests == [2, 3, 1]
    assert replies == [[3, 1, 2], [1, 2, 3]]
    assert request_reply._placement([1], 2, 2) == [[1], [1]], "one broker leads everything"
    assert all(sorted(r) == [1, 2] for r in request_reply._placement([1, 2], 3, 1))


def test_request_reply_warm_up_goes_on_while_the_brokers_jit_compiles_and_stops_once_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounds of both sides, identical; more rounds only while a round's JIT CPU is at or above
    JIT_SETTLED_US on either side, never past ``max_s`` of traffic."""
    from purgatory.tools.bench.reply import request_reply

    settled = request_reply.JIT_SETTLED_US
    jit_by_round = iter([settled * 3, settled * 2, settled / 2, settled * 5])
    calls: list[tuple[str, float]] = []
    jit_now = 0.0

    def fake_run_once(side: str, *args: object, warmup_s: float, **kwargs: object) -> request_reply.RunResult:
        nonlocal jit_now
        if side == "purgatory":
            jit_now = next(jit_by_round)
        calls.append((side, warmup_s))
        return request_reply.RunResult(
            side, 3, 1000.0, 500, 500, 0, 1000.0, 5.0, 9.0, 10.0, 200.0, 50.0, 700.0, 0.0, 0,
            brokers_jit_cpu_us_per_request=jit_now,
        )  # fmt: skip

    monkeypatch.setattr(request_reply, "run_once", fake_run_once)
    topics = request_reply.BenchTopics("requests", "replies")
    runs = request_reply._warm_up("b", topics, 3, 1000.0, 2, (), min_s=20.0, max_s=120.0)
    half = request_reply.WARMUP_ROUND_S / 2
    first, later = [("purgatory", 10.0), ("hand-rolled", 10.0)], [("purgatory", half), ("hand-rolled", half)]
    assert calls == [*first, *later, *later], "stopped after the third round: the first under the bound"
    assert len(runs) == 6

    calls.clear()
    jit_by_round = iter([settled * 3] * 100)
    runs = request_reply._warm_up("b", topics, 3, 1000.0, 2, (), min_s=20.0, max_s=45.0)
    assert calls == [*first, *later, *later], "20 s, then whole rounds while they fit in 45 s: 40 s"
