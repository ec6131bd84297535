"""``purgatory bench``: benchmarks against baselines measured side by side in the same run.

Every benchmark runs each side (this project, and its baselines) in its own subprocess,
alternating the order, ``--repeats`` times, and prints medians and the median of same-run
ratios in a table; the full figures go to a JSON file under ``bench-results/``. The core's
benchmarks are these commands; the others (``tools/bench/{kafka,service,reply,spark}``) come in
through the ``purgatory.bench`` entry points, as these do (pyproject.toml).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from purgatory import _accel

from ._report import DEFAULT_RESULTS_DIR, print_comparisons, save_results
from ._runner import Comparison, run_comparison

app = typer.Typer(help="Benchmarks against baselines measured in the same run.", no_args_is_help=True)

# Piped output (CI logs, files) gets a wide table rather than rich's 80-column default.
_console = Console(width=None if sys.stdout.isatty() else 160)

RepeatsOpt = Annotated[int, typer.Option("--repeats", "-r", min=1, help="Runs per side (medians over them).")]
SeedOpt = Annotated[int, typer.Option(help="Seed of the generated inputs (the same for every side).")]
OutOpt = Annotated[Path, typer.Option("--out", help="Directory for the JSON result file.")]


def _run_all(title: str, comparisons: list[Comparison], repeats: int) -> None:
    # Several figures of the same runs share one ``runs`` dict: run those once.
    to_run: list[Comparison] = []
    for comparison in comparisons:
        if not any(done.runs is comparison.runs for done in to_run):
            to_run.append(comparison)
    total = sum(len(c.sides) for c in to_run) * repeats
    _console.print(f"[bold]{title}[/] — purgatory timer: {_accel.status()}")
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=total)
        for comparison in to_run:

            def step(description: str) -> None:
                progress.update(task, description=description)

            run_comparison(comparison, repeats, step)
            progress.advance(task, len(comparison.sides) * repeats)
    for comparison in comparisons:  # siblings sharing runs share a failure too
        for done in to_run:
            if done.runs is comparison.runs and comparison.error is None:
                comparison.error = done.error


def _finish(
    bench: str, title: str, comparisons: list[Comparison], options: dict[str, Any], out: Path
) -> None:
    print_comparisons(_console, title, comparisons)
    path = save_results(bench, comparisons, options, out)
    missed = [t.description for c in comparisons for t, _value, met in c.verdicts() if not met]
    failed = [f"{c.case}: {c.error}" for c in comparisons if c.error is not None]
    for failure in failed:
        _console.print(f"[red]failed:[/] {failure}", highlight=False)
    if missed:
        _console.print(f"[red]targets missed:[/] {'; '.join(missed)}")
    _console.print(f"results: {path}")
    if failed:
        raise typer.Exit(1)  # a side broke a correctness check or crashed: not a figure


@app.command("list")
def list_benchmarks() -> None:
    """List the available benchmarks."""
    typer.echo("timer      timing wheel vs heapq timers: W1 add+cancel, W2 expire, W3 steady, memory, e2e")
    typer.echo("purgatory  Kafka's TestPurgatoryPerformance vs a naive pure-Python purgatory")
    typer.echo("expiry     lateness of expiry (p50/p99/max) with 100k pending under load")
    typer.echo(
        "request-reply  kp.request() round trips on local Kafka (1 and 3 brokers) vs a hand-rolled requester"
    )
    typer.echo("produce    kp.produce latency and burst rate with the read-back vs without it (same run)")
    typer.echo("chaos      seeded node kills, pauses, stops and service bounces under mixed load, checked")


DEFAULT_NS = [100_000]
DEFAULT_WORKLOADS = ["W1", "W2", "W3", "memory", "e2e"]
DEFAULT_SIDES = ["wheel", "heap_tuple", "asyncio_heap"]


@app.command("timer")
def timer_bench(
    n: Annotated[
        list[int] | None, typer.Option("--n", "-n", help="Timers per run (default 100000); repeatable.")
    ] = None,
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", "-w", help="W1, W2, W3, memory, e2e (default: all); repeatable."),
    ] = None,
    side: Annotated[
        list[str] | None,
        typer.Option(
            "--side", "-s", help="wheel, heap_tuple, asyncio_heap (default: all), or <side>_pure; repeatable."
        ),
    ] = None,
    iterations: Annotated[int, typer.Option(help="W3: add+cancel iterations.")] = 200_000,
    repeats: RepeatsOpt = 5,
    seed: SeedOpt = 1,
    out: OutOpt = DEFAULT_RESULTS_DIR,
) -> None:
    """Timing wheel vs heapq timers (docs/performance.md's workloads); -n 100000 -n 1000000 for both sizes."""
    from .core import timer

    ns = n or DEFAULT_NS
    workloads = workload or DEFAULT_WORKLOADS
    sides = side or DEFAULT_SIDES
    if "wheel" not in sides:
        raise typer.BadParameter("the sides must include 'wheel' (the subject)", param_hint="--side")
    try:
        comparisons = timer.comparisons(ns, workloads, sides, seed, iterations)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    title = "purgatory bench timer"
    _run_all(title, comparisons, repeats)
    options = {"n": ns, "workload": workloads, "side": sides, "iterations": iterations, "repeats": repeats}
    _finish("timer", title, comparisons, {**options, "seed": seed}, out)


@app.command("purgatory")
def purgatory_bench(
    num: Annotated[int, typer.Option("--num", help="Number of requests.")] = 100_000,
    rate: Annotated[
        list[float] | None,
        typer.Option(
            "--rate",
            help="Target requests per second, 0: as fast as the generator can go; repeatable "
            "(default: 100000 and 0).",
        ),
    ] = None,
    jvm: Annotated[
        bool,
        typer.Option(
            "--jvm/--no-jvm",
            help="Also run Kafka's own DelayedOperationPurgatory (kafka-server-common, resolved with "
            "Maven; needs java, javac and mvn) on the identical workload.",
        ),
    ] = False,
    pending: Annotated[
        int, typer.Option("--pending", help="Pending operations of the bytes-per-operation case.")
    ] = 100_000,
    gc_policy: Annotated[
        str,
        typer.Option(
            "--gc",
            help="Cyclic-GC policy of the Python sides' timed runs: interpreter (CPython's default "
            "thresholds) or service (admission.gc_thresholds, what `purgatory serve` runs with).",
        ),
    ] = "interpreter",
    keys: Annotated[int, typer.Option("--keys", help="Keys each request watches.")] = 3,
    key_space_size: Annotated[int, typer.Option("--key-space-size", help="Number of possible keys.")] = 100,
    timeout: Annotated[int, typer.Option("--timeout", help="Request timeout (ms).")] = 200,
    pct50: Annotated[
        float, typer.Option("--pct50", help="50th percentile of completion latency (ms).")
    ] = 20.0,
    pct75: Annotated[
        float, typer.Option("--pct75", help="75th percentile of completion latency (ms).")
    ] = 50.0,
    repeats: RepeatsOpt = 3,
    seed: SeedOpt = 1,
    out: OutOpt = DEFAULT_RESULTS_DIR,
) -> None:
    """Kafka's TestPurgatoryPerformance: this purgatory vs a naive pure-Python one (and Kafka's)."""
    from .core import purgatory_perf

    rates = list(rate) if rate else list(purgatory_perf.DEFAULT_RATES)
    params = purgatory_perf.PurgatoryParams(
        num, rates[0], keys, key_space_size, timeout, pct50, pct75, gc_policy
    )
    try:
        params.validate()
        comparisons = purgatory_perf.comparisons(params, seed, rates, jvm, pending)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if jvm:
        from .core import jvm as jvm_side

        missing = jvm_side.missing_tools()
        if missing:
            raise typer.BadParameter(f"--jvm needs {', '.join(missing)} on PATH", param_hint="--jvm")
        _console.print(f"JVM side: {jvm_side.prepare()}", highlight=False)
    title = "purgatory bench purgatory (Kafka's TestPurgatoryPerformance)"
    _run_all(title, comparisons, repeats)
    purgatory_perf.print_kafka_lines(_console, comparisons)
    options = {
        **params.as_dict(),
        "rate": rates,
        "jvm": jvm,
        "pending": pending,
        "repeats": repeats,
        "seed": seed,
    }
    _finish("purgatory", title, comparisons, options, out)


@app.command("expiry")
def expiry_bench(
    pending: Annotated[int, typer.Option(help="Timers kept pending.")] = 100_000,
    duration: Annotated[float, typer.Option(help="Measured seconds per run.")] = 5.0,
    load_rate: Annotated[
        int, typer.Option(help="Background adds (each with a cancel) per second while measuring.")
    ] = 20_000,
    repeats: RepeatsOpt = 3,
    seed: SeedOpt = 1,
    out: OutOpt = DEFAULT_RESULTS_DIR,
) -> None:
    """Lateness of expiry (p50/p99/max) with many timers pending, under add/cancel load."""
    from .core import expiry

    params = expiry.ExpiryParams(pending, duration, load_rate)
    try:
        params.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    comparisons = expiry.comparisons(params, seed)
    title = "purgatory bench expiry"
    _run_all(title, comparisons, repeats)
    _finish("expiry", title, comparisons, {**params.as_dict(), "repeats": repeats, "seed": seed}, out)
