"""``purgatory kafka``: the local Apache Kafka cluster (issue 3 fills this in)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Start, stop and inspect the local Apache Kafka cluster.", no_args_is_help=True)


@app.command("status")
def status() -> None:
    """Show whether a local cluster is running."""
    typer.echo("local Kafka launcher not available yet")
    raise typer.Exit(1)
