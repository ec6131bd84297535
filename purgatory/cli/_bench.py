"""``purgatory bench``: benchmarks. Adapters add theirs through the ``purgatory.bench`` entry points."""

from __future__ import annotations

import typer

app = typer.Typer(help="Benchmarks against baselines measured in the same run.", no_args_is_help=True)


@app.command("list")
def list_benchmarks() -> None:
    """List the available benchmarks."""
    typer.echo("no benchmarks yet")
