"""The Kafka adapter's settings sections: ``kafka`` (the connection) and ``scaleout`` (ownership).

The core composes them into :class:`purgatory.settings.Settings` through the entry-point group
``purgatory.settings`` (pyproject.toml), so they are read from ``PURGATORY_KAFKA__*`` /
``PURGATORY_SCALEOUT__*`` and the TOML tables ``[kafka]`` / ``[scaleout]`` as before they moved
here. A new field declared here is a setting everywhere (variables, TOML, ``purgatory config``)
without a change to the core.

``scaleout`` lives in the Kafka room, not the service's: the ownership group (``_ownership.py``)
and the reply router read it, and the Kafka adapter never imports the service.

Typed reading: ``KafkaSettings.of(settings)`` returns the ``kafka`` section as a
``KafkaSettings`` for mypy; ``settings.kafka`` works as well but is ``Any`` to mypy (the core's
``Settings`` cannot name an adapter's class).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from purgatory.settings import DurationMs, PositiveInt, Section, is_secret_name

__all__ = ["BOOTSTRAP_ENV", "KafkaSettings", "ScaleOutSettings"]

# What `purgatory kafka up` prints and the Kafka provider reads: an alias of
# PURGATORY_KAFKA__BOOTSTRAP_SERVERS, so one exported line configures every entry point.
BOOTSTRAP_ENV = "PURGATORY_KAFKA_BOOTSTRAP"


class KafkaSettings(Section):
    """Connection to Kafka (used by the adapters; the core never imports a Kafka client)."""

    env_aliases: ClassVar[Mapping[str, str]] = {BOOTSTRAP_ENV: "bootstrap_servers"}

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


MIN_SCALEOUT_SECRET_CHARS = 16


def _check_http_url(value: str) -> None:
    # fullmatch: re.match's "$" also matches before a trailing newline ("http://a:1\n").
    if not re.fullmatch(r"https?://[^/\s]+", value):
        raise ValueError(f"should be http(s)://host:port without a path, got {value!r}")


class ScaleOutSettings(Section):
    """Many instances of one service split the watched partitions through Kafka's group protocol.

    Each instance joins the consumer group ``group_id`` (subscribed to ``topics``) and owns the
    partitions the group assigns it; its ``advertised_url`` travels as the member's ``client.id``
    so that every instance can tell a client where a partition's owner is (docs/design.md §7).
    Any client able to join the group could advertise a URL too: an instance forwards or redirects
    only to members that prove they belong (``secret`` and/or ``trusted_urls``; docs/guide/scale-out.md).
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
    secret: SecretStr | None = Field(
        None,
        description="Shared by every instance of the service: each signs its advertised URL with it "
        "(HMAC-SHA256, carried in its client.id) and forwards or redirects only to members whose "
        f"signature verifies (at least {MIN_SCALEOUT_SECRET_CHARS} characters; docs/guide/scale-out.md).",
    )
    trusted_urls: tuple[str, ...] = Field(
        (),
        description="If set, only members advertising one of these URLs are forwarded or redirected "
        "to (with secret: both must hold). Scale-out needs secret or trusted_urls.",
        validate_default=True,
    )

    @field_validator("advertised_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            _check_http_url(value)
        return value

    @field_validator("secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_SCALEOUT_SECRET_CHARS:
            raise ValueError(
                f"should have at least {MIN_SCALEOUT_SECRET_CHARS} characters "
                "(e.g. the output of `openssl rand -hex 32`)"
            )
        return value

    # A field validator (validate_default: it runs when trusted_urls is not given), not a model
    # validator: a refusal then shows this field's value, never the section with its secret.
    @field_validator("trusted_urls")
    @classmethod
    def _owners_authenticated(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        for url in value:
            _check_http_url(url)
        advertised = info.data.get("advertised_url")
        if value and advertised and advertised not in value:
            raise ValueError(
                f"scaleout.advertised_url {advertised!r} is not one of scaleout.trusted_urls: "
                "the other instances would not trust this one"
            )
        if "secret" not in info.data:
            return value  # the secret itself was refused: that error says why
        # Secure by default: without a way to tell instances from any other group member, a
        # consumer joining the group with a forged client.id would receive forwarded requests
        # (with their callers' credentials) or have clients redirected to it.
        if info.data.get("enabled") and info.data["secret"] is None and not value:
            raise ValueError(
                "scaleout.enabled needs scaleout.secret (PURGATORY_SCALEOUT__SECRET, the same on "
                "every instance) or scaleout.trusted_urls (PURGATORY_SCALEOUT__TRUSTED_URLS): without "
                "them any member of the consumer group could pose as an instance"
            )
        return value
