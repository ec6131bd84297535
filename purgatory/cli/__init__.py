"""The ``purgatory`` console command.

Sub-commands live one module each; those needing optional extras (Kafka, Spark) import them
inside the command so ``purgatory --help`` works with the core install alone.
"""

from __future__ import annotations

import typer

from .._logging import configure_logging
from ..settings import ConfigError, load_settings
from . import _bench, _config, _demo, _kafka, _pipeline

app = typer.Typer(
    name="purgatory",
    help="Kafka's broker purgatory for Python services: demo, local Kafka, benchmarks, pipeline.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals may hold credentials
)


@app.callback()
def _configure() -> None:
    """Configure logging once for every sub-command (settings errors surface in the command)."""
    try:
        log = load_settings().log
        configure_logging(log.level, log.format)
    except ConfigError:
        configure_logging()


app.command("run", help="The main job: run the example end to end (starts local Kafka if none).")(_demo.run)
app.command("demo", help="A short in-process demonstration of the purgatory (no Kafka).")(_demo.demo)
app.add_typer(_config.app, name="config")
app.add_typer(_kafka.app, name="kafka")
app.add_typer(_bench.app, name="bench")
_pipeline.register(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
