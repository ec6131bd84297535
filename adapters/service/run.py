"""``purgatory run``: the README's main command (entry point ``run`` in group ``purgatory.cli``).

Kafka (a local cluster when none is configured), the example service, an HTTP exercise of it and
a report — see :mod:`.server._main`. This module stays light: every ``purgatory`` invocation loads the
CLI plugins, so the Kafka client, uvicorn and httpx are imported only when ``run`` runs. When one
of them is not installed, importing this module fails and the core CLI falls back to its
in-process demonstration as the main job.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Annotated

import typer

# The extras `run` needs (kafka, service, metrics; httpx is the exercising client).
REQUIRED_MODULES = ("confluent_kafka", "uvicorn", "starlette", "prometheus_client", "httpx")
_missing = [name for name in REQUIRED_MODULES if find_spec(name) is None]
if _missing:
    raise ImportError(f"purgatory run needs {', '.join(_missing)} (extras kafka, metrics, service)")

__all__ = ["run"]


def run(
    brokers: Annotated[
        int,
        typer.Option(
            "--brokers", "-b", min=1, max=3, help="Brokers of the local cluster (when none is configured)."
        ),
    ] = 1,
) -> None:
    """Start Kafka (unless configured) and the example service, exercise it over HTTP, report."""
    from .server._main import main

    if not main(brokers):
        raise typer.Exit(1)
