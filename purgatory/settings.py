"""Settings: environment (``PURGATORY_`` prefix, ``__`` nesting), a TOML file, then defaults.

Precedence, highest first: keyword arguments, environment variables, the TOML file named by
``PURGATORY_CONFIG_FILE`` (or passed as ``config_file``), defaults. Invalid values fail at start
with :class:`ConfigError`, which names the field, the value given, where it came from (which
variable, which file) and why it was refused. Credentials are ``SecretStr``: they never appear in
reprs, dumps or logs.

One bootstrap setting: ``kafka.bootstrap_servers`` (``PURGATORY_KAFKA__BOOTSTRAP_SERVERS``) also
reads ``PURGATORY_KAFKA_BOOTSTRAP``, the variable ``purgatory kafka up`` prints; when both are set
they must agree. A ``PURGATORY_*`` variable that names no setting (``PURGATORY_MAX_PENDNG``) is
reported with an :class:`UnknownSettingWarning` naming the closest setting.
:func:`setting_origins` says where each effective value came from (``purgatory config show``).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import types
import typing
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ._errors import PurgatoryError
from ._secrets import is_secret_name, remember_secret
from .timer._timing_wheel import MAX_WHEEL_SIZE

__all__ = [
    "BOOTSTRAP_ENV",
    "CONFIG_FILE_ENV",
    "AdmissionSettings",
    "ConfigError",
    "JournalSettings",
    "KafkaSettings",
    "LogSettings",
    "PurgatoryOverrides",
    "ScaleOutSettings",
    "ServiceSettings",
    "Settings",
    "TimerSettings",
    "UnknownSettingWarning",
    "is_secret_name",
    "load_settings",
    "setting_origins",
    "unknown_environment_variables",
]

ENV_PREFIX = "PURGATORY_"
ENV_NESTING = "__"
CONFIG_FILE_ENV = "PURGATORY_CONFIG_FILE"
# What `purgatory kafka up` prints and the Kafka provider reads: an alias of
# PURGATORY_KAFKA__BOOTSTRAP_SERVERS, so one exported line configures every entry point.
BOOTSTRAP_ENV = "PURGATORY_KAFKA_BOOTSTRAP"
# Variables with the prefix that are not settings fields but are read by the project itself
# (launchers, the build, the import switch). Known, so they are never reported as misspellings;
# add a name here when code starts reading a new one.
OTHER_ENV_VARIABLES = frozenset(
    {
        CONFIG_FILE_ENV,
        BOOTSTRAP_ENV,
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


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def model_post_init(self, context: Any, /) -> None:
        # Every secret a section holds is masked by value from now on (logs, `config show`),
        # wherever it escapes to: see purgatory._secrets.
        for name in type(self).model_fields:
            for secret in _secret_values(getattr(self, name)):
                remember_secret(secret)


class TimerSettings(_Section):
    tick_ms: PositiveInt = Field(
        1, le=MAX_TICK_MS, description="Resolution of the finest timing wheel, in ms (Kafka: 1)."
    )
    wheel_size: PositiveInt = Field(20, le=MAX_WHEEL_SIZE, description="Buckets per wheel level (Kafka: 20).")


class PurgatoryOverrides(_Section):
    """Per-purgatory values; unset fields fall back to the top-level ones."""

    purge_interval: NonNegativeInt | None = None
    max_pending: PositiveInt | None = None
    max_pending_per_key: PositiveInt | None = None
    reaper_poll_ms: DurationMs | None = None
    timer: TimerSettings | None = None


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: console on a terminal, JSON otherwise (production)."
    )


class KafkaSettings(_Section):
    """Connection to Kafka (used by the adapters; the core never imports a Kafka client)."""

    bootstrap_servers: str | None = Field(
        None, description="host:port[,host:port]; unset means: start the local cluster."
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    # Declared before client_config: its validator reads them.
    secret_keys: tuple[str, ...] = Field(
        (),
        description="client_config keys whose values are credentials, beyond those whose names say so "
        "(password, secret, key, token, credential, jaas, oauthbearer, private).",
    )
    client_config: dict[str, str | SecretStr] = Field(
        default_factory=dict,
        description="Extra librdkafka settings passed through (credential-like keys are kept secret).",
    )
    # 10 ms: completion lag is about interval + one poll (~2.5 ms) + re-checks; at 20 ms the p99
    # lag at 10k pending was 28 ms, at 10 ms 19.5 ms (purgatory bench kafka). Requests stay ~1.2
    # per poll whatever the number of pending operations.
    feed_interval_ms: DurationMs = Field(10, description="How often the change feed polls watched keys.")
    # push by default since a stopped broker no longer stretches long-poll answers past their
    # bound (tests/service/test_answer_bounds.py runs both modes); poll is the fallback.
    feed_mode: Literal["push", "poll"] = Field(
        "push",
        description="push (default): watched partitions are tailed by a consumer (the broker's fetch "
        "long poll wakes them) and polled every feed_refresh_ms. poll: every feed_interval_ms.",
    )
    feed_refresh_ms: DurationMs = Field(
        500,
        description="push mode: poll interval (leaders, ISR, log starts, outages) while every watched "
        "key is a tailed partition; groups, topics, untailed or degraded keys keep feed_interval_ms.",
    )

    @field_validator("client_config", mode="after")
    @classmethod
    def _hide_passthrough_credentials(
        cls, value: dict[str, str | SecretStr], info: ValidationInfo
    ) -> dict[str, str | SecretStr]:
        # 'sasl.password', 'ssl.key.pem', 'sasl.oauthbearer.config', 'my.apikey' and the keys
        # named in secret_keys, passed through, must be as invisible in dumps and reprs as the
        # typed credential fields.
        declared = info.data.get("secret_keys", ())
        return {
            key: SecretStr(item) if isinstance(item, str) and is_secret_name(key, declared) else item
            for key, item in value.items()
        }

    def client_config_values(self) -> dict[str, str]:
        """The passthrough properties with credentials unwrapped: only for handing to librdkafka."""
        return {
            key: item.get_secret_value() if isinstance(item, SecretStr) else item
            for key, item in self.client_config.items()
        }

    request_timeout_ms: DurationMs = Field(
        5000, description="Bound on one batched admin request of the cluster view (then: unavailable)."
    )
    append_timeout_ms: DurationMs = Field(
        10000, description="Delivery bound of a request-reply message (the sender's message.timeout.ms)."
    )
    produce_timeout_ms: DurationMs = Field(
        30000,
        description="Default timeout of a produce (DelayedProduce); also its producer's message.timeout.ms, "
        "the longest the producer retries a record across leader changes.",
    )
    # 1 ms, measured (purgatory bench produce, 1 and 3 local brokers, 2 shared cores): the linger
    # is added to every sequential produce's latency (p50 1.9 ms at 1, 3.3 at 2, 6.8 at 5 on one
    # broker), and 2 or 5 ms gave no throughput back at 32 or 256 produces in flight on one
    # broker (c32 6.2k/s at 1, 6.4k at 2, 4.2k at 5); at 3 brokers 5 ms was within the noise of
    # 1 ms there (c256 0.89x vs 0.83x of the plain producer). Same as the plain producer's.
    produce_linger_ms: int = Field(
        1,
        ge=0,
        le=1000,
        description="linger.ms of the produce producer: how long a record waits to share its batch.",
    )
    fetch_max_wait_ms: DurationMs = Field(500, description="Default DelayedFetch max_wait_ms (Kafka: 500).")
    commit_timeout_ms: DurationMs = Field(30000, description="Default delay_ms of DelayedConsumerCommit.")
    topic_ready_timeout_ms: DurationMs = Field(30000, description="Default delay_ms of DelayedTopicReady.")
    delete_records_timeout_ms: DurationMs = Field(
        30000, description="Default delay_ms of DelayedDeleteRecords."
    )


class AdmissionSettings(_Section):
    """How many waiters the example service holds (docs/design.md §8): past a limit, 429 + Retry-After.

    Memory is bounded by them: at most ``max_waiters`` operations (with their HTTP requests)
    are held, at most ``max_waiters_per_key`` of them on one partition, none longer than
    ``max_wait_ms``.
    """

    max_waiters: PositiveInt = Field(
        60_000, description="Waiting requests (long polls and produces) one service process holds."
    )
    max_waiters_per_key: PositiveInt = Field(
        50_000, description="Waiting requests on one partition (unless purgatories.<name> sets one)."
    )
    max_wait_ms: DurationMs = Field(
        30_000, description="Longer long polls (max_wait_ms) are clamped to this: answered by then."
    )
    retry_after_s: PositiveInt = Field(1, description="Retry-After of a 429 answer (service full).")
    gc_thresholds: tuple[PositiveInt, NonNegativeInt, NonNegativeInt] | None = Field(
        (50_000, 20, 100),
        description="The service's cyclic-GC thresholds while it serves (gc.set_threshold; start-up "
        "objects frozen): held waiters are long-lived. None: the interpreter's (700, 10, 10).",
    )


class JournalSettings(_Section):
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


class ScaleOutSettings(_Section):
    """Many instances of one service split the watched partitions through Kafka's group protocol.

    Each instance joins the consumer group ``group_id`` (subscribed to ``topics``) and owns the
    partitions the group assigns it; its ``advertised_url`` travels as the member's ``client.id``
    so that every instance can tell a client where a partition's owner is (docs/design.md §7).
    """

    enabled: bool = Field(False, description="Join the ownership group; serve only owned partitions.")
    group_id: str = Field(
        "purgatory-service", min_length=1, description="Consumer group the instances of one service join."
    )
    topics: tuple[str, ...] = Field(
        (), description="Topics whose partitions are split (a name starting with ^ is a regex)."
    )
    advertised_url: str | None = Field(
        None, description="This instance's base URL as clients reach it (e.g. http://10.0.0.7:8080)."
    )
    mode: Literal["redirect", "forward"] = Field(
        "redirect", description="A request for another owner's partition: 307 to it, or forwarded to it."
    )
    session_timeout_ms: DurationMs = Field(
        10000, description="Group session timeout: how long a dead instance keeps its partitions."
    )
    heartbeat_interval_ms: DurationMs = Field(1000, description="Group heartbeat interval.")
    owners_refresh_ms: DurationMs = Field(
        5000, description="DescribeConsumerGroups at most this often when nothing moved (else sooner)."
    )
    retry_after_s: PositiveInt = Field(
        1, description="Retry-After of a 503/307 while a partition has no owner or is moving."
    )
    forward_timeout_ms: DurationMs = Field(
        65000, description="Bound on one forwarded request (above the longest long poll)."
    )
    forward_max_connections: PositiveInt = Field(
        100, description="Connection pool of forwarding (all owners together)."
    )

    @field_validator("advertised_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        # fullmatch: re.match's "$" also matches before a trailing newline ("http://a:1\n").
        if value is not None and not re.fullmatch(r"https?://[^/\s]+", value):
            raise ValueError(f"should be http(s)://host:port without a path, got {value!r}")
        return value


class ServiceSettings(_Section):
    """The example HTTP service (``purgatory.adapters.service``): limits, authentication, topics.

    Authentication is off until configured: ``auth_tokens`` (clients send ``Authorization:
    Bearer <token>``) and/or TLS with ``tls_client_auth = "required"`` (every client presents a
    certificate signed by ``tls_ca_certs``). ``/healthz`` answers everyone, but shows cluster
    details (bootstrap servers, reachability) only to an authenticated client.
    """

    max_header_count: PositiveInt = Field(
        100, description="Requests with more header fields are refused (431)."
    )
    max_header_bytes: PositiveInt = Field(
        16 * 1024,
        description="Bound on a request's header block (431; h11 refuses larger heads before the app).",
    )
    head_read_timeout_ms: DurationMs = Field(
        10_000,
        description="A request head (request line and header fields) not received in full within "
        "this long is answered 408 and the connection closed (headers trickled slowly: slowloris).",
    )
    fast_long_poll: bool = Field(
        True,
        description="Serve idle long polls (GET .../partitions/{p}/records) below the ASGI app: a "
        "waiting poll holds no asyncio task and its answer is written from the batch wake-up "
        "(same checks and answers as the ASGI route; anything else still goes through it).",
    )
    answer_budget_bytes: PositiveInt = Field(
        256 * 1024 * 1024,
        description="Bound on the bytes of long-poll answers held while their clients are slow to read "
        "them (distinct answers, each counted once however many connections share it). Past it a new "
        "long poll is answered 429 MEMORY_BUDGET_EXCEEDED with Retry-After, and so is a waiting one "
        "whose answer would pass it (docs/limits.md).",
    )
    http2: bool = Field(
        True,
        description="Accept HTTP/2 with prior knowledge (h2c, the connection preface) on the same port "
        "beside HTTP/1.1: one connection multiplexes many long polls (idle ones served below the ASGI "
        "app, as with fast_long_poll; other requests bridged to it). Needs the service's own server.",
    )
    body_read_timeout_ms: DurationMs = Field(
        10_000,
        description="A request body not received in full within this long is answered 408 "
        "(a Content-Length larger than the body sent holds nothing forever).",
    )
    auth_tokens: tuple[SecretStr, ...] = Field(
        (), description="Bearer tokens accepted (any one); empty: no token authentication."
    )
    allowed_topics: tuple[str, ...] = Field(
        ("*",), description="Glob patterns (fnmatch, case-sensitive) of the topics clients may use."
    )
    denied_topics: tuple[str, ...] = Field(
        ("_*",),
        description="Glob patterns refused even when allowed (403). Default: names starting with '_' "
        "(Kafka's __consumer_offsets, __transaction_state; Confluent's _confluent-*, _schemas).",
    )
    tls_certfile: str | None = Field(None, description="Serve HTTPS with this certificate chain (PEM).")
    tls_keyfile: str | None = Field(None, description="Private key of tls_certfile (PEM).")
    tls_keyfile_password: SecretStr | None = None
    tls_ca_certs: str | None = Field(None, description="CA bundle that client certificates must chain to.")
    tls_client_auth: Literal["none", "required"] = Field(
        "none", description="required: mutual TLS, a client without a valid certificate is refused."
    )

    @field_validator("tls_client_auth")
    @classmethod
    def _mutual_tls_is_complete(cls, value: str, info: ValidationInfo) -> str:
        # "required" without a server certificate or a CA would serve plain HTTP unauthenticated.
        # (A field validator, not a model one: the error then quotes this value, not the
        # section's, which may hold the tokens.)
        missing = [name for name in ("tls_certfile", "tls_ca_certs") if info.data.get(name) is None]
        if value == "required" and missing:
            raise ValueError(f"'required' needs {' and '.join(missing)}")
        return value


class Settings(BaseSettings):
    """Every setting of the purgatory and its adapters."""

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
    kafka: KafkaSettings = KafkaSettings()
    journal: JournalSettings = JournalSettings()
    scaleout: ScaleOutSettings = ScaleOutSettings()
    admission: AdmissionSettings = AdmissionSettings()
    service: ServiceSettings = ServiceSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            env_settings,
            _BootstrapAliasSource(settings_cls),
        ]
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


class _BootstrapAliasSource(PydanticBaseSettingsSource):
    """``PURGATORY_KAFKA_BOOTSTRAP`` as ``kafka.bootstrap_servers`` (below the canonical variable).

    Placed after the environment source and before the TOML file: the exported line of
    ``purgatory kafka up`` beats a file, and ``load_settings`` refuses the two variables disagreeing.
    """

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ builds the whole (nested) value

    def __call__(self) -> dict[str, Any]:
        value = _environ().get(BOOTSTRAP_ENV)
        return {"kafka": {"bootstrap_servers": value}} if value else {}


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
    known = sorted({*_setting_variables(Settings), *OTHER_ENV_VARIABLES})
    unknown: dict[str, str | None] = {}
    for name in sorted(names):
        if not name.startswith(ENV_PREFIX) or name in OTHER_ENV_VARIABLES:
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

    Mirrors the sources' precedence (environment, the bootstrap alias, the file): a variable
    holding JSON (``PURGATORY_KAFKA='{...}'``) is the origin of every value beneath it.
    """

    def __init__(self, config_file: str | None) -> None:
        env = _environ()
        self.variables: dict[SettingPath, str] = {}
        for name in env:
            if name.startswith(ENV_PREFIX) and name not in OTHER_ENV_VARIABLES:
                path = _env_path(name)
                if _names_a_setting(path):
                    self.variables[path] = name
        if env.get(BOOTSTRAP_ENV) and ("kafka", "bootstrap_servers") not in self.variables:
            self.variables.setdefault(("kafka", "bootstrap_servers"), BOOTSTRAP_ENV)
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


def _check_bootstrap_alias() -> None:
    env = _environ()
    alias, canonical = env.get(BOOTSTRAP_ENV), env.get("PURGATORY_KAFKA__BOOTSTRAP_SERVERS")
    if alias and canonical and alias != canonical:
        raise ConfigError(
            f"invalid settings: {BOOTSTRAP_ENV}={alias!r} and "
            f"PURGATORY_KAFKA__BOOTSTRAP_SERVERS={canonical!r} disagree; set one of them"
        )


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the effective settings, or raise :class:`ConfigError` explaining every bad field.

    Warns (:class:`UnknownSettingWarning`) about each ``PURGATORY_*`` variable naming no setting.
    """
    path = str(config_file) if config_file is not None else os.environ.get(CONFIG_FILE_ENV)
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"config file {path!r} does not exist or is not a file")
    _warn_unknown_variables()
    _check_bootstrap_alias()
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
