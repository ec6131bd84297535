"""config/: the example settings per environment load, and the JSON Schema matches the Settings model."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from purgatory.cli import app
from purgatory.cli._config import render_settings_schema
from purgatory.settings import ConfigError, Settings, load_settings

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
SCHEMA_FILE = CONFIG_DIR / "settings.schema.json"
ENVIRONMENTS = ("dev", "docker", "production")

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_purgatory_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files alone decide what loads: the developer's own PURGATORY_* variables must not leak in."""
    for name in list(os.environ):
        if name.startswith("PURGATORY_"):
            monkeypatch.delenv(name)


def _example(env: str) -> Path:
    return CONFIG_DIR / f"{env}.toml"


def test_every_environment_has_an_example_file() -> None:
    shipped = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
    assert shipped == sorted(ENVIRONMENTS), f"config/ should hold one TOML per environment, has {shipped}"


def test_schema_file_is_the_schema_generated_from_the_settings_model() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == render_settings_schema(), (
        "config/settings.schema.json is out of date: run "
        "`purgatory config schema -o config/settings.schema.json`"
    )


def test_schema_names_every_section_of_the_settings() -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert set(schema["properties"]) == set(Settings.model_fields)
    assert schema["additionalProperties"] is False, "unknown keys are refused, as Settings refuses them"


def test_schema_check_command_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "settings.schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    result = runner.invoke(app, ["config", "schema", "-o", str(stale), "--check"])
    assert result.exit_code == 1
    assert "out of date" in result.output
    written = runner.invoke(app, ["config", "schema", "-o", str(stale)])
    assert written.exit_code == 0, written.output
    assert runner.invoke(app, ["config", "schema", "-o", str(stale), "--check"]).exit_code == 0


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_example_file_loads_with_load_settings(env: str) -> None:
    settings = load_settings(_example(env))
    # Every key written in the file was taken (a typo would have been refused: extra="forbid").
    written = tomllib.loads(_example(env).read_text(encoding="utf-8"))
    assert settings.log.level == written["log"]["level"]
    assert settings.kafka.bootstrap_servers == written["kafka"].get("bootstrap_servers")
    assert set(settings.purgatories) == {"fetch", "produce"}, "the example service's two purgatories"


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_example_file_validates_against_the_schema(env: str) -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    document = tomllib.loads(_example(env).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(document)


def test_schema_refuses_what_settings_refuse() -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    bad = {"timer": {"tick_ms": 0}, "kafka": {"bogus": 1}}
    errors = {"/".join(map(str, e.absolute_path)) for e in validator.iter_errors(bad)}
    assert "timer/tick_ms" in errors
    assert "kafka" in errors, "additional property refused"
    with pytest.raises(ConfigError, match=r"timer\.tick_ms"):
        load_settings(**bad)


def test_development_leaves_kafka_unset_so_the_local_cluster_is_started() -> None:
    assert load_settings(_example("dev")).kafka.bootstrap_servers is None


def test_production_file_holds_no_secret_and_takes_it_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = _example("production").read_text(encoding="utf-8")
    document = tomllib.loads(text)
    assert "sasl_password" not in document["kafka"] and "ssl_key_password" not in document["kafka"]
    monkeypatch.setenv("PURGATORY_KAFKA__SASL_PASSWORD", "s3cret-from-env")
    settings = load_settings(_example("production"))
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == "s3cret-from-env"
    assert settings.kafka.sasl_username == "purgatory", "the file's other kafka keys are kept (deep merge)"
    assert "s3cret-from-env" not in repr(settings)
    assert settings.log.format == "json"


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1234")
    settings = load_settings(_example("docker"))
    assert settings.kafka.bootstrap_servers == "127.0.0.1:1234"
    assert settings.journal.spark_master == "spark://spark-master:7077", "the rest of the file still applies"


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_config_show_prints_each_example_file(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_KAFKA__SASL_PASSWORD", "never-printed-secret")
    result = runner.invoke(app, ["config", "show", "--config", str(_example(env))])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown == json.loads(load_settings(_example(env)).model_dump_json())
    assert shown["kafka"]["sasl_password"] == "**********"
    assert "never-printed-secret" not in result.output
