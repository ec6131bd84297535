"""``purgatory config``: the effective settings, and the JSON Schema of every setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ..settings import ConfigError, Settings, load_settings

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


# pydantic emits JSON Schema draft 2020-12; saying so lets editors (taplo, VS Code) validate TOML.
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def settings_schema() -> dict[str, Any]:
    """The JSON Schema of :class:`Settings` (what ``config/settings.schema.json`` holds)."""
    return {"$schema": SCHEMA_DIALECT, **Settings.model_json_schema()}


def render_settings_schema() -> str:
    """The schema as the file stores it: 2-space JSON, one trailing newline (stable diffs)."""
    return json.dumps(settings_schema(), indent=2, ensure_ascii=False) + "\n"


@app.command("schema")
def schema(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (e.g. config/settings.schema.json).")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if --output differs from the settings (CI).")
    ] = False,
) -> None:
    """Print (or write) the JSON Schema of every setting, generated from the Settings model."""
    text = render_settings_schema()
    if output is None:
        typer.echo(text, nl=False)
        return
    if check:
        current = output.read_text(encoding="utf-8") if output.is_file() else ""
        if current != text:
            typer.echo(f"{output} is out of date: run `purgatory config schema -o {output}`", err=True)
            raise typer.Exit(1)
        return
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output}")
