"""``purgatory analyze``: the PySpark journal pipeline (issue 5 fills this in)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the pipeline commands to the main app."""
