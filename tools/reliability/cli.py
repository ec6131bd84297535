"""``purgatory bench reliability``: the soak, the fault scenarios and the bad-input matrix, in one report.

Registered under the ``purgatory.bench`` entry points. The Kafka fault scenarios start a local
one-broker cluster of their own (stopped by PID at the end); ``--no-kafka`` runs without it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import structlog.testing
import typer
from rich.console import Console

from ._bad_input import run_bad_inputs
from ._faults import FaultResult, callback_faults
from ._report import ReliabilityReport
from ._soak import run_soak

__all__ = ["reliability"]

DEFAULT_RESULTS_DIR = Path("bench-results")


def _kafka_faults(with_groups: bool, console: Console) -> tuple[list[FaultResult], dict[str, str]]:
    names = ["broker killed", "broker paused", "journal's Kafka sink unreachable"]
    try:
        from purgatory.adapters import kafka

        from . import kafka_faults as scenarios
    except ImportError as exc:
        return [], dict.fromkeys(names, f"the kafka extra is not installed ({exc})")
    cluster = kafka.LocalKafkaCluster(brokers=1)
    console.print("starting a local one-broker Kafka for the fault scenarios ...")
    try:
        with structlog.testing.capture_logs():
            cluster.start()
    except Exception as exc:  # no Java, no Maven: report, do not crash the whole bench
        return [], dict.fromkeys(names, f"the local Kafka did not start: {exc}")
    results: list[FaultResult] = []
    try:
        for mode in ("kill", "pause"):
            results.append(scenarios.broker_fault(cluster, mode, with_groups=with_groups))
        results.append(scenarios.journal_sink_unreachable(cluster))
    finally:
        with structlog.testing.capture_logs():
            cluster.stop()
    return results, {}


def reliability(
    operations: Annotated[int, typer.Option(min=1, help="Soak: operations per round.")] = 1_000_000,
    threads: Annotated[int, typer.Option(min=1, help="Soak: submitting threads.")] = 8,
    keys: Annotated[int, typer.Option(min=2, help="Soak: distinct watch keys.")] = 1000,
    expire_fraction: Annotated[
        float, typer.Option(min=0.0, max=0.9, help="Soak: share of operations that must expire.")
    ] = 0.3,
    seconds: Annotated[
        float, typer.Option(min=0.0, help="Soak: repeat rounds until this long has passed (0: one round).")
    ] = 0.0,
    kafka: Annotated[
        bool, typer.Option(help="Run the Kafka fault scenarios (starts a local broker).")
    ] = True,
    with_groups: Annotated[
        bool,
        typer.Option(help="Include consumer-group operations (DelayedConsumerCommit) in the broker faults."),
    ] = True,
    out: Annotated[Path, typer.Option("--out", help="Directory for the JSON report.")] = DEFAULT_RESULTS_DIR,
) -> None:
    """Load held, faults survived, bad inputs tried: nothing lost, nothing finished twice."""
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(f"soak: {operations:,} operations, {threads} threads, {expire_fraction:.0%} expiring ...")
    began = time.monotonic()
    soak = run_soak(operations, threads, keys, expire_fraction)
    round_no = 1
    # Every round is checked; the first failing one ends the soak and is the one reported.
    while soak.ok and time.monotonic() - began < seconds:
        soak = run_soak(operations, threads, keys, expire_fraction, seed=round_no)
        round_no += 1
    report = ReliabilityReport(soak, soak_rounds=round_no, soak_seconds=time.monotonic() - began)
    console.print("faults: user callbacks raising ...")
    report.faults.append(callback_faults())
    if kafka:
        results, skipped = _kafka_faults(with_groups, console)
        report.faults.extend(results)
        report.skipped_faults.update(skipped)
    else:
        report.skipped_faults["Kafka faults"] = "--no-kafka"
    console.print("bad inputs ...")
    with structlog.testing.capture_logs():
        report.bad_inputs = run_bad_inputs()
    report.print(console)
    path = report.save(out)
    console.print(f"report: {path}")
    if not report.ok:
        raise typer.Exit(1)
