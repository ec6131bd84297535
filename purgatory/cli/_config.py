"""``purgatory config``: the effective settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..settings import ConfigError, load_settings

app = typer.Typer(help="Inspect settings.", no_args_is_help=True)


@app.command("show")
def show(
    config_file: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file (else PURGATORY_CONFIG_FILE).")
    ] = None,
) -> None:
    """Print the effective settings as JSON, secrets masked."""
    try:
        settings = load_settings(config_file)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    # mode="json" renders SecretStr as "**********": secrets never reach the terminal.
    typer.echo(json.dumps(settings.model_dump(mode="json"), indent=2))
