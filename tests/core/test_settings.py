"""Settings: env prefix and nesting, TOML file, precedence, and refusals that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from purgatory.settings import ConfigError, load_settings


def test_defaults_match_kafka() -> None:
    s = load_settings()
    assert (s.timer.tick_ms, s.timer.wheel_size, s.reaper_poll_ms, s.purge_interval) == (1, 20, 200, 1000)
    assert s.max_pending is None and s.drain_on_shutdown is True


def test_environment_with_prefix_and_double_underscore_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_TIMER__WHEEL_SIZE", "64")
    monkeypatch.setenv("PURGATORY_MAX_PENDING", "1000")
    s = load_settings()
    assert s.timer.wheel_size == 64 and s.max_pending == 1000


def test_toml_file_with_per_purgatory_overrides_and_env_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "purgatory.toml"
    config.write_text(
        "purge_interval = 500\n"
        "[timer]\ntick_ms = 2\n"
        "[purgatories.Produce]\nmax_pending = 10\n[purgatories.Produce.timer]\nwheel_size = 8\n"
    )
    monkeypatch.setenv("PURGATORY_PURGE_INTERVAL", "700")
    s = load_settings(config)
    assert s.purge_interval == 700, "environment wins over the file"
    assert s.timer.tick_ms == 2
    produce = s.for_purgatory("Produce")
    assert produce == {
        "purge_interval": 700,
        "max_pending": 10,
        "reaper_poll_ms": 200,
        "tick_ms": 1,
        "wheel_size": 8,
    }
    assert s.for_purgatory("Fetch")["tick_ms"] == 2


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("PURGATORY_TIMER__TICK_MS", "0", "timer.tick_ms"),
        ("PURGATORY_TIMER__WHEEL_SIZE", "-4", "timer.wheel_size"),
        ("PURGATORY_PURGE_INTERVAL", "lots", "purge_interval"),
        ("PURGATORY_MAX_PENDING", "0", "max_pending"),
        ("PURGATORY_LOG__LEVEL", "LOUD", "log.level"),
        ("PURGATORY_KAFKA__FEED_INTERVAL_MS", "-1", "kafka.feed_interval_ms"),
    ],
)
def test_invalid_values_fail_naming_field_value_and_reason(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert field in message and repr(value) in message
    assert "should" in message.lower() or "input" in message.lower(), f"no reason given: {message}"


def test_unknown_setting_in_the_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("tick_size = 3\n")
    with pytest.raises(ConfigError, match="tick_size"):
        load_settings(config)


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_secrets_are_masked_in_reprs_dumps_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_KAFKA__SASL_PASSWORD", "hunter2-secret")
    s = load_settings()
    assert s.kafka.sasl_password is not None
    assert s.kafka.sasl_password.get_secret_value() == "hunter2-secret"
    assert "hunter2-secret" not in repr(s)
    assert "hunter2-secret" not in str(s.model_dump(mode="json"))
    monkeypatch.setenv("PURGATORY_KAFKA__SSL_KEY_PASSWORD", "")
    monkeypatch.setenv("PURGATORY_KAFKA__SECURITY_PROTOCOL", "hunter2-secret-typo")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "kafka.security_protocol" in str(info.value)


def test_purgatory_from_settings_applies_per_name_overrides(tmp_path: Path) -> None:
    import threading

    from purgatory import DelayedOperationPurgatory

    config = tmp_path / "p.toml"
    config.write_text(
        "[purgatories.Fetch]\nmax_pending = 7\npurge_interval = 3\n[purgatories.Fetch.timer]\ntick_ms = 5\n"
    )
    p: DelayedOperationPurgatory = DelayedOperationPurgatory.from_settings("Fetch", load_settings(config))  # type: ignore[type-arg]
    try:
        assert (p.max_pending, p.purge_interval) == (7, 3)
        assert p._timer._core.wheel.tick_ms == 5  # type: ignore[attr-defined]
    finally:
        p.shutdown()
    assert not any(t.name == "executor-Fetch" for t in threading.enumerate()), "its own timer is closed"
