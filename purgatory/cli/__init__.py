"""The ``purgatory`` console command.

Sub-commands live one module each; those needing optional extras (Kafka, Spark) import them
inside the command so ``purgatory --help`` works with the core install alone.
"""

from __future__ import annotations

import typer

from .._logging import configure_logging
from ..plugins import BENCH_GROUP, CLI_GROUP, load_plugins
from ..settings import ConfigError, load_settings
from . import _config, _demo

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


app.command("demo", help="A short in-process demonstration of the purgatory (no Kafka).")(_demo.demo)
app.add_typer(_config.app, name="config")
# ``purgatory bench``: every command comes through the ``purgatory.bench`` entry points (every
# benchmark lives in purgatory.tools.bench, by subject).
bench_app = typer.Typer(help="Benchmarks against baselines measured in the same run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _attach(target: typer.Typer, name: str, obj: object) -> None:
    if isinstance(obj, typer.Typer):
        target.add_typer(obj, name=name)
    elif callable(obj):
        target.command(name)(obj)


# Adapters add commands through entry points (the core never imports them): ``purgatory.cli``
# entries become top-level commands or groups, ``purgatory.bench`` entries ``bench`` commands.
_cli_plugins = load_plugins(CLI_GROUP)
for _name, _obj in _cli_plugins.items():
    _attach(app, _name, _obj)
for _name, _obj in load_plugins(BENCH_GROUP).items():
    _attach(bench_app, _name, _obj)
if "run" not in _cli_plugins:
    # Without the Kafka example installed, the main job is the in-process demonstration.
    app.command("run", help="The main job (here: the in-process demonstration).")(_demo.run)


def main() -> None:
    app()


__all__ = ["app", "bench_app", "main"]
