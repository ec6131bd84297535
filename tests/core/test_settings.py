"""Settings: env prefix and nesting, TOML file, precedence, and refusals that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from purgatory.settings import (
    ConfigError,
    UnknownSettingWarning,
    load_settings,
    setting_origins,
    unknown_environment_variables,
)


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
        "max_pending_per_key": None,
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
        # Accepted once, then allocated buckets until the kernel killed the process.
        ("PURGATORY_TIMER__WHEEL_SIZE", "1099511627776", "timer.wheel_size"),
        ("PURGATORY_PURGE_INTERVAL", "lots", "purge_interval"),
        ("PURGATORY_MAX_PENDING", "0", "max_pending"),
        ("PURGATORY_LOG__LEVEL", "LOUD", "log.level"),
        ("PURGATORY_KAFKA__FEED_INTERVAL_MS", "-1", "kafka.feed_interval_ms"),
        # Durations past Kafka's int32 of ms were accepted and reached librdkafka (or a timer).
        ("PURGATORY_KAFKA__APPEND_TIMEOUT_MS", str(10**20), "kafka.append_timeout_ms"),
        ("PURGATORY_ADMISSION__MAX_WAIT_MS", str(2**31), "admission.max_wait_ms"),
        ("PURGATORY_SERVICE__HEAD_READ_TIMEOUT_MS", str(2**40), "service.head_read_timeout_ms"),
        ("PURGATORY_TIMER__TICK_MS", "3600000", "timer.tick_ms"),
        # re.match's "$" also matches before a trailing newline: this URL was accepted.
        ("PURGATORY_SCALEOUT__ADVERTISED_URL", "http://127.0.0.1:8000\n", "scaleout.advertised_url"),
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


# -- one bootstrap setting, origins, unknown variables (issue 13) ------------------------------


def test_the_variable_kafka_up_prints_sets_bootstrap_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", "127.0.0.1:39092")
    assert load_settings().kafka.bootstrap_servers == "127.0.0.1:39092"


def test_the_canonical_bootstrap_variable_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PURGATORY_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", "broker:9092")
    assert load_settings().kafka.bootstrap_servers == "broker:9092"


def test_bootstrap_alias_beats_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "p.toml"
    config.write_text('[kafka]\nbootstrap_servers = "from-file:9092"\n')
    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", "from-env:9092")
    assert load_settings(config).kafka.bootstrap_servers == "from-env:9092"


def test_bootstrap_variables_that_disagree_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", "a:9092")
    monkeypatch.setenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", "b:9092")
    with pytest.raises(ConfigError, match=r"PURGATORY_KAFKA_BOOTSTRAP='a:9092'.*disagree"):
        load_settings()


def test_a_misspelt_variable_is_reported_with_the_closest_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_MAX_PENDNG", "10")
    suggestion = r"PURGATORY_MAX_PENDNG .*did you mean PURGATORY_MAX_PENDING"
    with pytest.warns(UnknownSettingWarning, match=suggestion):
        settings = load_settings()
    assert settings.max_pending is None, "the misspelt variable set nothing"


def test_a_misspelt_nested_variable_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_KAFKA__BOOTSTRAP_SERVER", "x:1")
    unknown = unknown_environment_variables()
    assert unknown == {"PURGATORY_KAFKA__BOOTSTRAP_SERVER": "PURGATORY_KAFKA__BOOTSTRAP_SERVERS"}


def test_a_misspelt_nested_variable_refused_by_its_section_is_named_as_the_origin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PURGATORY_SERVICE__MAX_HEADR_COUNT", "5")
    origin = r"service\.max_headr_count \(from env PURGATORY_SERVICE__MAX_HEADR_COUNT\): unknown setting"
    suggestion = "did you mean PURGATORY_SERVICE__MAX_HEADER_COUNT"
    with pytest.warns(UnknownSettingWarning, match=suggestion), pytest.raises(ConfigError, match=origin):
        load_settings()


def test_variables_the_project_reads_are_not_reported() -> None:
    environ = {
        "PURGATORY_PURE": "1",
        "PURGATORY_CONFIG_FILE": "x.toml",
        "PURGATORY_KAFKA_BOOTSTRAP": "h:1",
        "PURGATORY_PURGATORIES__FETCH__MAX_PENDING": "5",
        "PURGATORY_KAFKA__CLIENT_CONFIG": "{}",
        "PURGATORY_KAFKA": "{}",
        "OTHER_VARIABLE": "x",
    }
    assert unknown_environment_variables(environ) == {}


def test_invalid_values_name_the_variable_that_gave_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_TIMER__TICK_MS", "0")
    with pytest.raises(ConfigError, match=r"timer.tick_ms = '0' \(from env PURGATORY_TIMER__TICK_MS\)"):
        load_settings()


def test_invalid_values_name_the_file_that_gave_them(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[timer]\nwheel_size = -3\n")
    with pytest.raises(ConfigError, match=rf"timer.wheel_size = -3 \(from file {config}\)"):
        load_settings(config)


def test_setting_origins_say_env_file_or_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "p.toml"
    config.write_text("purge_interval = 5\n[timer]\ntick_ms = 2\n[purgatories.produce]\nmax_pending = 3\n")
    monkeypatch.setenv("PURGATORY_TIMER__TICK_MS", "4")
    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", "h:1")
    monkeypatch.delenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    origins = setting_origins(load_settings(config), config)
    assert origins["timer.tick_ms"] == "env PURGATORY_TIMER__TICK_MS", "the environment wins"
    assert origins["purge_interval"] == f"file {config}"
    assert origins["purgatories.produce.max_pending"] == f"file {config}"
    assert origins["kafka.bootstrap_servers"] == "env PURGATORY_KAFKA_BOOTSTRAP"
    assert origins["timer.wheel_size"] == "default"


def test_every_variable_the_code_reads_is_known_to_the_settings() -> None:
    """A variable some module reads must not be reported as a misspelt setting."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    read: set[str] = set()
    for folder in ("purgatory", "adapters", "tools"):
        for source in (root / folder).rglob("*.py"):
            read |= set(re.findall(r"environ(?:\.get)?\(\s*\"(PURGATORY_[A-Z_]+)\"", source.read_text()))
            read |= set(re.findall(r"^[A-Z_]+_ENV = \"(PURGATORY_[A-Z_]+)\"", source.read_text(), re.M))
    assert read, "the scan found the variables the code reads"
    assert unknown_environment_variables(dict.fromkeys(read, "x")) == {}
