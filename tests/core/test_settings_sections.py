"""Adapters own their settings sections; the core composes them (entry points, register_section).

A field added to an adapter's section class is a setting everywhere (its variable, its TOML key,
the schema, the unknown-variable check, the error messages) without a line of purgatory/settings.py
changing: these tests add fields and sections from here, as an adapter would from its own module.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import Field, ValidationError

import purgatory.settings
from purgatory.cli._config import settings_schema
from purgatory.settings import (
    ConfigError,
    PositiveInt,
    Section,
    Settings,
    UnknownSettingWarning,
    load_settings,
    register_section,
    setting_origins,
    settings_sections,
    unknown_environment_variables,
    unregister_section,
)

Register = Callable[[str, type[Section]], None]


@pytest.fixture
def register() -> Iterator[Register]:
    """register_section, undone after the test (the registry is process-wide)."""
    names: list[str] = []

    def add(name: str, section: type[Section]) -> None:
        register_section(name, section)
        names.append(name)

    yield add
    for name in reversed(names):
        unregister_section(name)


def _service_with_a_budget() -> type[Section]:
    """The installed service section plus one limit, as the service adapter would declare it."""
    installed = settings_sections()["service"]

    class ServiceWithBudget(installed):  # type: ignore[valid-type,misc]
        long_poll_budget_bytes: PositiveInt = Field(
            1024, description="Bytes of answers one long poll may hold (a limit added in the service)."
        )

    return ServiceWithBudget


def test_the_adapters_sections_come_from_their_own_modules_through_entry_points() -> None:
    sections = settings_sections()
    assert {name: cls.__module__ for name, cls in sections.items()} == {
        "admission": "purgatory.adapters.service.settings",
        "kafka": "purgatory.adapters.kafka.settings",
        "scaleout": "purgatory.adapters.kafka.settings",
        "service": "purgatory.adapters.service.settings",
    }
    assert set(sections) <= set(Settings.model_fields)
    settings = load_settings()
    assert type(settings.kafka) is sections["kafka"] and type(settings.service) is sections["service"]


def test_a_field_added_to_the_service_section_is_a_variable_and_a_toml_key(
    register: Register, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = _service_with_a_budget()
    register("service", service)
    monkeypatch.setenv("PURGATORY_SERVICE__LONG_POLL_BUDGET_BYTES", "4096")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownSettingWarning)  # the new variable is a known one
        from_env = load_settings()
    assert from_env.service.long_poll_budget_bytes == 4096
    assert from_env.service.max_header_count == 100, "the section's other fields keep their defaults"
    assert service.of(from_env).long_poll_budget_bytes == 4096, "typed read of the replaced section"
    assert settings_sections()["service"] is service

    monkeypatch.delenv("PURGATORY_SERVICE__LONG_POLL_BUDGET_BYTES")
    config = tmp_path / "purgatory.toml"
    config.write_text("[service]\nlong_poll_budget_bytes = 2048\nmax_header_count = 50\n")
    from_file = load_settings(config)
    assert (from_file.service.long_poll_budget_bytes, from_file.service.max_header_count) == (2048, 50)

    schema = settings_schema()
    assert "long_poll_budget_bytes" in schema["$defs"]["ServiceWithBudget"]["properties"]


def test_a_bad_value_of_an_added_field_names_the_field_and_its_variable(
    register: Register, monkeypatch: pytest.MonkeyPatch
) -> None:
    register("service", _service_with_a_budget())
    monkeypatch.setenv("PURGATORY_SERVICE__LONG_POLL_BUDGET_BYTES", "0")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert "service.long_poll_budget_bytes = '0'" in message
    assert "env PURGATORY_SERVICE__LONG_POLL_BUDGET_BYTES" in message


def test_unregistering_the_replacement_brings_the_installed_section_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed = settings_sections()["service"]
    register_section("service", _service_with_a_budget())
    unregister_section("service")
    assert settings_sections()["service"] is installed
    monkeypatch.setenv("PURGATORY_SERVICE__LONG_POLL_BUDGET_BYTES", "4096")
    assert "PURGATORY_SERVICE__LONG_POLL_BUDGET_BYTES" in unknown_environment_variables()
    with (
        pytest.warns(UnknownSettingWarning, match="PURGATORY_SERVICE__LONG_POLL_BUDGET_BYTES"),
        pytest.raises(ConfigError, match=r"service\.long_poll_budget_bytes .*unknown setting"),
    ):
        load_settings()


class ExampleSection(Section):
    """A section of code that is not installed (an application's own plugin)."""

    limit: PositiveInt = 3


def test_a_section_registered_in_code_is_composed_into_settings(
    register: Register, monkeypatch: pytest.MonkeyPatch
) -> None:
    register("example", ExampleSection)
    assert "example" in Settings.model_fields
    assert Settings(example={"limit": 9}).example.limit == 9
    assert Settings.model_validate({"example": {"limit": 8}}).example.limit == 8
    monkeypatch.setenv("PURGATORY_EXAMPLE__LIMIT", "5")
    settings = load_settings()
    assert ExampleSection.of(settings).limit == 5
    assert "example" in settings_schema()["properties"]


def test_a_removed_section_is_refused_again() -> None:
    register_section("example", ExampleSection)
    unregister_section("example")
    assert "example" not in Settings.model_fields
    with pytest.raises(ValidationError, match="example"):
        Settings(example={"limit": 9})
    with pytest.raises(LookupError, match="ExampleSection is not a settings section"):
        ExampleSection.of(Settings())


@pytest.mark.parametrize(
    ("name", "error"),
    [("timer", "a setting of the core"), ("journal", "a setting of the core"), ("my__section", "lower-case")],
)
def test_section_names_that_would_clash_are_refused(name: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        register_section(name, ExampleSection)


def test_a_section_must_be_a_model_class() -> None:
    with pytest.raises(TypeError, match="pydantic model class"):
        register_section("example", dict)  # type: ignore[arg-type]


def test_the_old_names_resolve_through_the_registry_with_a_deprecation_warning() -> None:
    for old, section in [
        ("KafkaSettings", "kafka"),
        ("ScaleOutSettings", "scaleout"),
        ("AdmissionSettings", "admission"),
        ("ServiceSettings", "service"),
    ]:
        moved = rf"{old} is deprecated: import it from purgatory\.adapters"
        with pytest.warns(DeprecationWarning, match=moved):
            cls = getattr(purgatory.settings, old)
        assert cls is settings_sections()[section]
    with pytest.raises(AttributeError, match="NoSuchSettings"):
        purgatory.settings.NoSuchSettings  # noqa: B018


class AliasedSection(Section):
    """A section that reads one field from an extra variable too (as Kafka's bootstrap alias)."""

    env_aliases = {"PURGATORY_EXAMPLE_ENDPOINT": "endpoint"}
    endpoint: str | None = None


def test_a_sections_own_alias_variable_sets_its_field_below_the_canonical_variable(
    register: Register, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    register("example", AliasedSection)
    config = tmp_path / "purgatory.toml"
    config.write_text('[example]\nendpoint = "from-file"\n')
    monkeypatch.setenv("PURGATORY_EXAMPLE_ENDPOINT", "from-alias")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the alias is a known variable, not a misspelling
        settings = load_settings(config)
    assert AliasedSection.of(settings).endpoint == "from-alias", "the alias beats the file"
    assert setting_origins(settings, config)["example.endpoint"] == "env PURGATORY_EXAMPLE_ENDPOINT"
    monkeypatch.setenv("PURGATORY_EXAMPLE__ENDPOINT", "from-alias")
    assert AliasedSection.of(load_settings(config)).endpoint == "from-alias", "equal values agree"
    monkeypatch.setenv("PURGATORY_EXAMPLE__ENDPOINT", "canonical")
    with pytest.raises(
        ConfigError, match="PURGATORY_EXAMPLE_ENDPOINT='from-alias' and PURGATORY_EXAMPLE__ENDPOINT"
    ):
        load_settings(config)


def test_the_bootstrap_alias_is_declared_by_the_kafka_section_and_the_old_name_warns() -> None:
    kafka = settings_sections()["kafka"]
    assert dict(kafka.env_aliases) == {"PURGATORY_KAFKA_BOOTSTRAP": "bootstrap_servers"}
    with pytest.warns(DeprecationWarning, match="BOOTSTRAP_ENV is deprecated"):
        assert purgatory.settings.BOOTSTRAP_ENV == "PURGATORY_KAFKA_BOOTSTRAP"
