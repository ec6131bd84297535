"""The console command: demo and config show."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from purgatory.cli import app
from purgatory.demo import run_demo

runner = CliRunner()


def test_demo_finishes_every_operation_exactly_once() -> None:
    summary = run_demo(9)
    assert summary.lost == 0 and summary.double_finished == 0
    assert summary.completed + summary.expired == 9
    assert summary.completed > 0 and summary.expired > 0, "the demo shows both ways of finishing"


def test_config_show_prints_effective_settings_with_secrets_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_KAFKA__SASL_PASSWORD", "hunter2-secret")
    monkeypatch.setenv("PURGATORY_TIMER__WHEEL_SIZE", "32")
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["timer"]["wheel_size"] == 32
    assert shown["kafka"]["sasl_password"] == "**********"
    assert "hunter2-secret" not in result.output


def test_config_show_explains_invalid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_TIMER__TICK_MS", "-1")
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 2
    assert "timer.tick_ms" in result.output


def test_config_show_says_where_each_value_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_TIMER__WHEEL_SIZE", "32")
    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", "127.0.0.1:39092")
    monkeypatch.delenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kafka"]["bootstrap_servers"] == "127.0.0.1:39092"
    assert "# kafka.bootstrap_servers: env PURGATORY_KAFKA_BOOTSTRAP" in result.stderr
    listed = runner.invoke(app, ["config", "show", "--sources"]).stdout.splitlines()
    assert "timer.wheel_size = 32  # env PURGATORY_TIMER__WHEEL_SIZE" in listed
    assert "timer.tick_ms = 1  # default" in listed
