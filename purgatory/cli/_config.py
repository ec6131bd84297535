"""``purgatory config``: the effective settings, and the JSON Schema of every setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from .._secrets import mask_secret_values
from ..settings import ConfigError, Settings, load_settings, setting_origins

app = typer.Typer(help="Inspect settings.", no_args_is_help=True)


@app.command("show")
def show(
    config_file: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file (else PURGATORY_CONFIG_FILE).")
    ] = None,
    sources: Annotated[
        bool, typer.Option("--sources", help="One line per value: its name, value and origin.")
    ] = False,
) -> None:
    """Print the effective settings as JSON, secrets masked; where each value came from on stderr.

    Values not at their default are listed on stderr with their origin (``env NAME`` or
    ``file PATH``), so stdout stays parseable JSON; ``--sources`` prints every value with its
    origin instead.
    """
    try:
        settings = load_settings(config_file)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    # mode="json" renders SecretStr as "**********" (masked by name); a secret value that also
    # sits in a field not named as one (a username equal to a token...) is masked by value.
    shown = settings.model_dump(mode="json")
    origins = setting_origins(settings, config_file)
    if sources:
        values = dict(_leaves(shown))
        for name, origin in origins.items():
            typer.echo(mask_secret_values(f"{name} = {json.dumps(values.get(name))}  # {origin}"))
        return
    typer.echo(mask_secret_values(json.dumps(shown, indent=2)))
    for name, origin in origins.items():
        if origin != "default":
            typer.echo(f"# {name}: {origin}", err=True)


def _leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in _leaves(item, f"{prefix}{key}.")]
    return [(prefix.removesuffix("."), value)]


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
