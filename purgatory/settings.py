"""Settings: environment (``PURGATORY_`` prefix, ``__`` nesting), a TOML file, then defaults.

Precedence, highest first: keyword arguments, environment variables, the TOML file named by
``PURGATORY_CONFIG_FILE`` (or passed as ``config_file``), defaults. Invalid values fail at start
with :class:`ConfigError`, which names the field, the value given, where it came from (which
variable, which file) and why it was refused. Credentials are ``SecretStr``: they never appear in
reprs, dumps or logs.

A section may name extra variables for its fields (:attr:`Section.env_aliases`): the Kafka
section reads ``PURGATORY_KAFKA_BOOTSTRAP`` (what ``purgatory kafka up`` prints) as
``kafka.bootstrap_servers``; an alias ranks below its canonical variable, above the file, and when
both are set they must agree. A ``PURGATORY_*`` variable that names no setting (``PURGATORY_MAX_PENDNG``) is
reported with an :class:`UnknownSettingWarning` naming the closest setting.
:func:`setting_origins` says where each effective value came from (``purgatory config show``).

The core declares its own sections (``timer``, ``log``, ``journal``, the purgatory's limits); each
adapter declares its sections in its own ``settings`` module (``kafka`` and ``scaleout`` in
``purgatory.adapters.kafka.settings``, ``service`` and ``admission`` in
``purgatory.adapters.service.settings``) and announces them under the entry-point group
``purgatory.settings``; :func:`register_section` adds one from code that is not installed.
:class:`Settings` composes them as fields of itself before it is first used as a model (built,
validated, its fields or schema read), and again when the registry changes, so that a new field
of an adapter's section is a variable (``PURGATORY_SERVICE__<FIELD>``), a TOML key, part of
``purgatory config schema`` and of the unknown-variable check, with no change here.

Reading a section: ``settings.kafka`` works at run time, but the core cannot name an adapter's
class, so to mypy it is ``Any``; ``KafkaSettings.of(settings)`` (:meth:`Section.of`) returns it
typed. The old names ``purgatory.settings.KafkaSettings`` (and ``ScaleOutSettings``,
``AdmissionSettings``, ``ServiceSettings``) still resolve, through the registry, with a
``DeprecationWarning``: import them from their adapter's ``settings`` module.
"""

from __future__ import annotations

import difflib
import os
import threading
import tomllib
import types
import typing
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

import annotated_types
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
)

# pydantic's own metaclass, public in all of pydantic 2 though under _internal: Settings extends it
# only to compose the adapters' sections before the class is used (see _ComposedSettingsMeta).
from pydantic._internal._model_construction import ModelMetaclass
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ._errors import PurgatoryError
from ._secrets import is_secret_name, remember_secret
from ._settings_registry import SETTINGS_GROUP, SectionRegistry
from .timer._timing_wheel import MAX_WHEEL_SIZE

__all__ = [
    "CONFIG_FILE_ENV",
    "MAX_DURATION_MS",
    "SETTINGS_GROUP",
    "ConfigError",
    "DurationMs",
    "Int",
    "JournalSettings",
    "LogSettings",
    "NonNegativeInt",
    "PositiveInt",
    "PurgatoryOverrides",
    "Section",
    "Settings",
    "TimerSettings",
    "UnknownSettingWarning",
    "is_secret_name",
    "load_settings",
    "register_section",
    "setting_origins",
    "settings_sections",
    "unknown_environment_variables",
    "unregister_section",
]

ENV_PREFIX = "PURGATORY_"
ENV_NESTING = "__"
CONFIG_FILE_ENV = "PURGATORY_CONFIG_FILE"
# Variables with the prefix that are not settings fields but are read by the project itself
# (launchers, the build, the import switch). Known, so they are never reported as misspellings;
# add a name here when code starts reading a new one.
OTHER_ENV_VARIABLES = frozenset(
    {
        CONFIG_FILE_ENV,
        "PURGATORY_PURE",  # purgatory._accel: run the pure-Python modules
        "PURGATORY_PURE_BUILD",  # setup.py: skip mypyc
        "PURGATORY_KAFKA_CACHE",  # the local Kafka launcher's jar cache
        "PURGATORY_KAFKA_VERSION",  # the local Kafka launcher's Kafka version
        "PURGATORY_SPARK_JARS_DIR",  # Spark's Kafka connector jars
        "PURGATORY_CACHE_DIR",  # the shared Maven resolver's cache (adapters/_maven.py)
        "PURGATORY_BENCH_KAFKA_VERSION",  # the JVM side of `purgatory bench purgatory --jvm`
    }
)


def _no_bool(value: object) -> object:
    # pydantic's lax mode reads `true` as 1: `max_pending = true` would silently mean 1.
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


Int = Annotated[int, BeforeValidator(_no_bool)]
PositiveInt = Annotated[int, annotated_types.Gt(0), BeforeValidator(_no_bool)]
NonNegativeInt = Annotated[int, annotated_types.Ge(0), BeforeValidator(_no_bool)]
# A duration in ms: at most Kafka's (and librdkafka's) int32 of milliseconds, ~24.8 days. A larger
# one is a typo (10**20 was accepted and reached librdkafka, which refused it at first use, or a
# timer that never fires); refused at start, naming the field.
MAX_DURATION_MS = 2**31 - 1
DurationMs = Annotated[
    int, annotated_types.Gt(0), annotated_types.Le(MAX_DURATION_MS), BeforeValidator(_no_bool)
]
# The finest wheel's tick: Kafka's is 1 ms; past a minute a timer could not honour any timeout.
MAX_TICK_MS = 60_000


class ConfigError(PurgatoryError, ValueError):
    """Settings were refused: the message lists each field, the value given, its source and why."""


class UnknownSettingWarning(UserWarning):
    """A ``PURGATORY_*`` environment variable names no setting (probably a misspelling)."""


def _secret_values(value: object) -> Iterator[str]:
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _secret_values(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _secret_values(item)


class Section(BaseModel):
    """Base of every settings section (the core's and the adapters'): frozen, unknown keys refused,
    its secrets masked by value once it exists."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Extra variables read as fields of this section: {"PURGATORY_KAFKA_BOOTSTRAP":
    # "bootstrap_servers"}. Below the field's own variable, above the TOML file; load_settings
    # refuses an alias and its field's variable set to different values.
    env_aliases: ClassVar[Mapping[str, str]] = {}

    def model_post_init(self, context: Any, /) -> None:
        # Every secret a section holds is masked by value from now on (logs, `config show`),
        # wherever it escapes to: see purgatory._secrets.
        for name in type(self).model_fields:
            for secret in _secret_values(getattr(self, name)):
                remember_secret(secret)

    @classmethod
    def of(cls, settings: Settings) -> Self:
        """This adapter section's value in ``settings``, typed for mypy: ``KafkaSettings.of(s)``.

        Found by class in the registry (a subclass registered in its place counts as it).
        """
        name = _REGISTRY.name_of(cls)
        value = getattr(settings, name)
        if not isinstance(value, cls):
            raise TypeError(f"settings.{name} is a {type(value).__qualname__}, not a {cls.__qualname__}")
        return value


class TimerSettings(Section):
    tick_ms: PositiveInt = Field(
        1, le=MAX_TICK_MS, description="Resolution of the finest timing wheel, in ms (Kafka: 1)."
    )
    wheel_size: PositiveInt = Field(20, le=MAX_WHEEL_SIZE, description="Buckets per wheel level (Kafka: 20).")


class PurgatoryOverrides(Section):
    """Per-purgatory values; unset fields fall back to the top-level ones."""

    purge_interval: NonNegativeInt | None = None
    max_pending: PositiveInt | None = None
    max_pending_per_key: PositiveInt | None = None
    reaper_poll_ms: DurationMs | None = None
    timer: TimerSettings | None = None


class LogSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: console on a terminal, JSON otherwise (production)."
    )


class JournalSettings(Section):
    """The operation journal (``purgatory.journal``) and its Spark analytics (``purgatory analyze``)."""

    enabled: bool = Field(False, description="Journal every operation's lifecycle.")
    sinks: tuple[Literal["file", "kafka"], ...] = Field(
        ("file",), description="Where events go: rotated JSON-lines files, a topic."
    )
    directory: str = Field("journal", description="Directory of the file sink's segments.")
    max_file_bytes: PositiveInt = Field(64 * 1024 * 1024, description="Rotate a segment past this size.")
    max_files: PositiveInt = Field(20, description="Keep at most this many segments (oldest deleted).")
    topic: str = Field("purgatory-journal", min_length=1, description="Topic of the Kafka sink.")
    create_topic: bool = Field(
        False, description="Kafka sink: create the topic at start when missing (else refuse to start)."
    )
    queue_capacity: PositiveInt = Field(100_000, description="Events queued before new ones are dropped.")
    batch_size: PositiveInt = Field(1000, description="Events handed to the sinks per call.")
    flush_interval_ms: DurationMs = Field(100, description="Longest time an event waits in the queue.")
    spark_master: str = Field("local[*]", min_length=1, description="Spark master of `purgatory analyze`.")
    window: str = Field("1 minute", description="Width of the analytics' tumbling event-time windows.")
    watermark: str = Field("10 minutes", description="Streaming: how late an event may arrive and count.")


def _compose_sections() -> None:
    # _COMPOSER is looked up at call time: the metaclass runs while Settings is being created,
    # before it exists.
    composer = globals().get("_COMPOSER")
    if composer is not None:
        composer.compose()


class _ComposedSettingsMeta(ModelMetaclass):
    """pydantic's model metaclass, composing the registered sections into the class first.

    Reading ``Settings.model_fields``, ``model_validate``, ``model_json_schema`` or pydantic's own
    ``__pydantic_*__`` (a subclass's creation reads them) composes the sections when the registry
    changed since the last time; any other attribute costs one string test.
    """

    def __getattribute__(cls, name: str) -> Any:
        if name.startswith(("model_", "__pydantic_")):
            _compose_sections()
        return super().__getattribute__(name)


class Settings(BaseSettings, metaclass=_ComposedSettingsMeta):
    """Every setting of the purgatory and its adapters."""

    # The docstring above is the JSON Schema's description (config/settings.schema.json). The
    # adapters' sections are composed in as fields by _SectionComposer: see the module docstring.

    model_config = SettingsConfigDict(
        env_prefix="PURGATORY_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    timer: TimerSettings = TimerSettings()
    reaper_poll_ms: DurationMs = Field(200, description="Longest wait of one reaper step (Kafka: 200).")
    purge_interval: NonNegativeInt = Field(
        1000, description="Purge watch lists past this many completed ops."
    )
    max_pending: PositiveInt | None = Field(None, description="Refuse new operations past this many timed.")
    max_pending_per_key: PositiveInt | None = Field(
        None, description="Refuse new operations on a key already watched by this many."
    )
    drain_on_shutdown: bool = True
    broker_id: Int = 0
    purgatories: dict[str, PurgatoryOverrides] = Field(default_factory=dict)
    log: LogSettings = LogSettings()
    journal: JournalSettings = JournalSettings()
    # The adapters' sections (kafka, scaleout, admission, service...) are added by _SectionComposer.

    def __init__(self, /, **values: Any) -> None:
        # Settings(...) reaches pydantic through type.__call__ and the instance's attributes,
        # which the metaclass does not see: compose here.
        _compose_sections()
        super().__init__(**values)

    if TYPE_CHECKING:
        # An adapter's section is a field added at run time: to mypy it is Any here. Typed reading
        # goes through the section's class: KafkaSettings.of(settings).
        def __getattr__(self, name: str) -> Any: ...

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        sources.append(_SectionAliasSource(settings_cls))
        toml_file = _TOML_FILE.get("path") or os.environ.get(CONFIG_FILE_ENV)
        if toml_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(toml_file)))
        return tuple(sources)

    def for_purgatory(self, name: str) -> dict[str, Any]:
        """Constructor arguments for the purgatory ``name``: its overrides over the top level."""
        override = self.purgatories.get(name, PurgatoryOverrides())
        timer = override.timer or self.timer
        return {
            "purge_interval": (
                self.purge_interval if override.purge_interval is None else override.purge_interval
            ),
            "max_pending": override.max_pending if override.max_pending is not None else self.max_pending,
            "max_pending_per_key": (
                self.max_pending_per_key
                if override.max_pending_per_key is None
                else override.max_pending_per_key
            ),
            "reaper_poll_ms": override.reaper_poll_ms or self.reaper_poll_ms,
            "tick_ms": timer.tick_ms,
            "wheel_size": timer.wheel_size,
        }


class _SectionComposer:
    """Makes the registry's sections fields of ``Settings``, again whenever the registry changes.

    In place rather than a subclass per registry state: ``Settings(...)``, ``isinstance(x,
    Settings)``, ``Settings.model_fields`` and ``Settings.model_json_schema()`` keep meaning the one
    class that users and adapters import. Lazily, at first use rather than at import: loading the
    entry points imports the adapters, which import this module.
    """

    def __init__(self, model: type[BaseSettings], registry: SectionRegistry) -> None:
        self._model = model
        self._registry = registry
        self._version = 0  # the registry's version last composed
        self._composed: dict[str, type[BaseModel]] = {}
        # Lock: one thread composes while others wait. _busy: the composing thread's own reads of
        # the class (pydantic's rebuild, an adapter imported by the entry points) see it as it is.
        self._lock = threading.RLock()
        self._busy = threading.local()

    def _stale(self) -> bool:
        return self._version != self._registry.version and not getattr(self._busy, "on", False)

    def compose(self) -> None:
        if not self._stale():
            return
        with self._lock:
            if not self._stale():
                return
            self._busy.on = True
            try:
                version, sections = self._registry.snapshot()
                fields = self._model.__pydantic_fields__
                composed = {name: fields[name] for name in self._composed}
                core = {name: field for name, field in fields.items() if name not in composed}
                # The core's fields, then the sections in the registry's order: the same order
                # (schema, `config show`) whatever was registered and removed before.
                fields.clear()
                fields.update(core)
                for name, section in sections.items():
                    if self._composed.get(name) is section:
                        fields[name] = composed[name]
                    else:
                        # As if declared `name: section = section()` in the class body.
                        fields[name] = FieldInfo.from_annotated_attribute(section, section())
                self._composed = sections
                self._model.model_rebuild(force=True)
                self._version = version
            finally:
                self._busy.on = False


_REGISTRY = SectionRegistry(reserved=Settings.__annotations__)
_COMPOSER = _SectionComposer(Settings, _REGISTRY)


def register_section(name: str, section: type[Section]) -> None:
    """Compose ``section`` into :class:`Settings` as ``name`` (replacing one of that name).

    For sections of code that is not installed; an installed adapter announces its sections under
    the entry-point group ``purgatory.settings`` instead. Settings built afterwards carry it:
    ``PURGATORY_<NAME>__<FIELD>``, the TOML table ``[<name>]``, the schema.
    """
    _REGISTRY.register(name, section)


def unregister_section(name: str) -> None:
    """Remove the section ``name`` that :func:`register_section` added (an installed one returns)."""
    _REGISTRY.unregister(name)


def settings_sections() -> dict[str, type[BaseModel]]:
    """The adapters' sections composed into :class:`Settings`, by name (installed, then registered)."""
    return _REGISTRY.sections()


# Sections that moved to their adapter: name here -> section name. Resolved through the registry
# (the core imports no adapter) for the code that still imports them from here.
_MOVED_SECTIONS = {
    "KafkaSettings": "kafka",
    "ScaleOutSettings": "scaleout",
    "AdmissionSettings": "admission",
    "ServiceSettings": "service",
}


def __getattr__(name: str) -> Any:
    if name == "BOOTSTRAP_ENV":  # moved with the Kafka section, which declares it as its alias
        warnings.warn(
            "purgatory.settings.BOOTSTRAP_ENV is deprecated: "
            "import it from purgatory.adapters.kafka.settings",
            DeprecationWarning,
            stacklevel=2,
        )
        return "PURGATORY_KAFKA_BOOTSTRAP"
    section = _MOVED_SECTIONS.get(name)
    if section is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    installed = _REGISTRY.installed()
    if section not in installed:
        raise AttributeError(
            f"purgatory.settings.{name} moved to its adapter, whose section {section!r} is not "
            f"installed (entry points of {SETTINGS_GROUP}: {sorted(installed)})"
        )
    cls = installed[section]
    warnings.warn(
        f"purgatory.settings.{name} is deprecated: import it from {cls.__module__}",
        DeprecationWarning,
        stacklevel=2,
    )
    return cls


class _SectionAliasSource(PydanticBaseSettingsSource):
    """Every section's :attr:`Section.env_aliases` set in the environment, as that section's fields.

    Placed after the environment source and before the TOML file: the exported line of
    ``purgatory kafka up`` beats a file, and ``load_settings`` refuses an alias and its field's
    own variable disagreeing.
    """

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ builds the whole (nested) value

    def __call__(self) -> dict[str, Any]:
        env = _environ()
        values: dict[str, Any] = {}
        for section, variable, field in _section_aliases():
            if env.get(variable):
                values.setdefault(section, {})[field] = env[variable]
        return values


def _section_aliases() -> Iterator[tuple[str, str, str]]:
    """``(section, VARIABLE, field)`` for every alias the composed sections declare."""
    for section, cls in _REGISTRY.sections().items():
        for variable, field in getattr(cls, "env_aliases", {}).items():
            yield section, variable.upper(), field


def _alias_variables() -> frozenset[str]:
    return frozenset(variable for _, variable, _ in _section_aliases())


# load_settings hands the TOML path to settings_customise_sources (a classmethod) through here.
_TOML_FILE: dict[str, str] = {}

SettingPath = tuple[str, ...]


def _environ() -> dict[str, str]:
    # pydantic-settings matches names case-insensitively (case_sensitive=False); so do we.
    return {name.upper(): value for name, value in os.environ.items()}


def _unwrap(annotation: Any) -> Any:
    """``X | None`` → ``X``; ``Annotated[X, ...]`` → ``X``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _names_a_setting(parts: SettingPath, model: type[BaseModel] | None = None) -> bool:
    """True when the lower-case path ``parts`` names a field (or a value inside a dict field)."""
    model = model or Settings
    if not parts:
        return True
    field = model.model_fields.get(parts[0])
    if field is None:
        return False
    annotation = _unwrap(field.annotation)
    rest = parts[1:]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _names_a_setting(rest, annotation)
    if typing.get_origin(annotation) is dict:
        if len(rest) <= 1:
            return True  # the whole dict (JSON), or one entry by its key
        value = _unwrap(typing.get_args(annotation)[1])
        return isinstance(value, type) and issubclass(value, BaseModel) and _names_a_setting(rest[1:], value)
    return not rest


def _setting_variables(model: type[BaseModel], prefix: str = ENV_PREFIX) -> Iterator[str]:
    """Every variable naming a leaf setting (``PURGATORY_KAFKA__BOOTSTRAP_SERVERS``, ...)."""
    for name, field in model.model_fields.items():
        annotation = _unwrap(field.annotation)
        variable = prefix + name.upper()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _setting_variables(annotation, variable + ENV_NESTING)
        else:
            yield variable


def _env_path(variable: str) -> SettingPath:
    return tuple(variable[len(ENV_PREFIX) :].lower().split(ENV_NESTING))


def unknown_environment_variables(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``PURGATORY_*`` variables that name no setting, each with the closest known name (or None)."""
    names = {name.upper() for name in (environ if environ is not None else os.environ)}
    known = sorted({*_setting_variables(Settings), *OTHER_ENV_VARIABLES, *_alias_variables()})
    unknown: dict[str, str | None] = {}
    for name in sorted(names):
        if not name.startswith(ENV_PREFIX) or name in OTHER_ENV_VARIABLES or name in known:
            continue
        if _names_a_setting(_env_path(name)):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        unknown[name] = close[0] if close else None
    return unknown


def _warn_unknown_variables() -> None:
    for name, suggestion in unknown_environment_variables().items():
        hint = f"; did you mean {suggestion}?" if suggestion else ""
        warnings.warn(
            f"environment variable {name} is not a setting and is ignored{hint}",
            UnknownSettingWarning,
            # Attributed to this line, not the caller's: Python's default filter then shows each
            # message once per process, however many entry points load the settings.
            stacklevel=1,
        )


def _flatten(value: Any, path: SettingPath = ()) -> Iterator[tuple[SettingPath, Any]]:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _flatten(item, (*path, str(key)))
    else:
        yield path, value


class _Origins:
    """Which source gave a setting: an environment variable, the TOML file, or the default.

    Mirrors the sources' precedence (environment, the sections' aliases, the file): a variable
    holding JSON (``PURGATORY_KAFKA='{...}'``) is the origin of every value beneath it.
    """

    def __init__(self, config_file: str | None) -> None:
        env = _environ()
        self.variables: dict[SettingPath, str] = {}
        for name in env:
            # Every variable, also one naming no setting: a misspelt nested one
            # (PURGATORY_SERVICE__MAX_HEADR_COUNT) is refused by its section, and the error
            # must name the variable it came from, not "default".
            if name.startswith(ENV_PREFIX) and name not in OTHER_ENV_VARIABLES:
                self.variables[_env_path(name)] = name
        for section, variable, field in _section_aliases():
            if env.get(variable):
                self.variables.setdefault((section, field), variable)
        self.config_file = config_file
        self.file_paths: set[SettingPath] = set()
        if config_file:
            try:
                with open(config_file, "rb") as handle:
                    self.file_paths = {path for path, _ in _flatten(tomllib.load(handle))}
            except (OSError, tomllib.TOMLDecodeError):
                pass  # the settings source reports the file's own error

    def of(self, path: SettingPath) -> str:
        lowered = tuple(part.lower() for part in path)
        for end in range(len(lowered), 0, -1):
            variable = self.variables.get(lowered[:end])
            if variable is not None:
                return f"env {variable}"
        if any(path[:end] in self.file_paths for end in range(len(path), 0, -1)):
            return f"file {self.config_file}"
        return "default"


def setting_origins(settings: Settings, config_file: str | Path | None = None) -> dict[str, str]:
    """Where each effective value came from: ``env NAME``, ``file PATH`` or ``default``.

    Keys are dotted paths of the leaf values (``kafka.bootstrap_servers``), as ``config show``
    prints them. ``config_file`` defaults to ``PURGATORY_CONFIG_FILE``, as in :func:`load_settings`.
    """
    path = str(config_file) if config_file is not None else os.environ.get(CONFIG_FILE_ENV)
    origins = _Origins(path)
    return {".".join(leaf): origins.of(leaf) for leaf, _ in _flatten(settings.model_dump(mode="json"))}


def _explain(error: ValidationError, origins: _Origins, overrides: Mapping[str, Any]) -> str:
    lines = ["invalid settings:"]
    for item in error.errors():
        loc = tuple(str(part) for part in item["loc"])
        field = ".".join(loc) or "<root>"
        source = "argument" if loc and loc[0] in overrides else origins.of(loc)
        if item["type"] == "extra_forbidden":
            # An unknown name may be a misspelt credential ('sasl_pasword'): never echo its value.
            lines.append(f"  {field} (from {source}): unknown setting (value not shown); check the spelling")
            continue
        shown = "<secret>" if is_secret_name(field) or field.endswith("_key") else repr(item.get("input"))
        lines.append(f"  {field} = {shown} (from {source}): {item['msg']}")
    return "\n".join(lines)


def _check_aliases() -> None:
    env = _environ()
    for section, variable, field in _section_aliases():
        canonical_name = f"{ENV_PREFIX}{section.upper()}{ENV_NESTING}{field.upper()}"
        alias, canonical = env.get(variable), env.get(canonical_name)
        if alias and canonical and alias != canonical:
            raise ConfigError(
                f"invalid settings: {variable}={alias!r} and {canonical_name}={canonical!r} disagree; "
                "set one of them"
            )


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the effective settings, or raise :class:`ConfigError` explaining every bad field.

    Warns (:class:`UnknownSettingWarning`) about each ``PURGATORY_*`` variable naming no setting.
    """
    path = str(config_file) if config_file is not None else os.environ.get(CONFIG_FILE_ENV)
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"config file {path!r} does not exist or is not a file")
    _warn_unknown_variables()
    _check_aliases()
    origin = f"environment PURGATORY_*, file {path}" if path else "environment PURGATORY_*"
    if path:
        _TOML_FILE["path"] = path
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, _Origins(path), overrides)) from None
    except ValueError as exc:  # e.g. malformed TOML or JSON in a nested env variable
        raise ConfigError(f"invalid settings ({origin}): {exc}") from None
    finally:
        _TOML_FILE.pop("path", None)
