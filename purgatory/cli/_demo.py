"""``purgatory demo`` / ``purgatory run``: the main job."""

from __future__ import annotations

from typing import Annotated

import typer

from ..demo import run_demo


def demo(
    operations: Annotated[int, typer.Option(help="How many operations to submit.", min=1, max=100_000)] = 12,
) -> None:
    """Operations completed by key events and by expiry, printed as they finish."""
    summary = run_demo(operations)
    if summary.lost or summary.double_finished:
        raise typer.Exit(1)


def run() -> None:
    """The main job when the Kafka example service is not installed: the in-process demonstration."""
    demo(operations=12)
