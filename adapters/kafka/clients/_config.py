"""librdkafka configurations built from :class:`purgatory.settings.KafkaSettings`.

Secrets are unwrapped from ``SecretStr`` only here, into the dict handed to librdkafka;
:func:`redacted` is the only form of a config that may be logged.
"""

from __future__ import annotations

from collections.abc import Mapping

from purgatory._secrets import MASK, mask_secret_values
from purgatory.settings import is_secret_name

from ..settings import KafkaSettings
from ._errors import KafkaConfigError

__all__ = [
    "PRODUCE_GUARANTEES",
    "SECRET_CONFIG_KEYS",
    "check_client_config",
    "client_config",
    "redacted",
]

# librdkafka properties whose values are credentials: never logged.
SECRET_CONFIG_KEYS = frozenset(
    {"sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret"}
)


def client_config(
    settings: KafkaSettings, bootstrap_servers: str | None = None, **extra: str
) -> dict[str, str]:
    """A librdkafka config: connection and security from ``settings``, then passthrough, then ``extra``."""
    servers = bootstrap_servers or settings.bootstrap_servers
    if not servers:
        raise ValueError("kafka.bootstrap_servers is not set and no bootstrap servers were given")
    config: dict[str, str] = {"bootstrap.servers": servers, "security.protocol": settings.security_protocol}
    optional = {
        "sasl.mechanism": settings.sasl_mechanism,
        "sasl.username": settings.sasl_username,
        "ssl.ca.location": settings.ssl_ca_location,
        "ssl.certificate.location": settings.ssl_certificate_location,
        "ssl.key.location": settings.ssl_key_location,
    }
    config.update({k: v for k, v in optional.items() if v is not None})
    if settings.sasl_password is not None:
        config["sasl.password"] = settings.sasl_password.get_secret_value()
    if settings.ssl_key_password is not None:
        config["ssl.key.password"] = settings.ssl_key_password.get_secret_value()
    config.update(settings.client_config_values())
    config.update(extra)
    return config


def redacted(config: Mapping[str, object]) -> dict[str, object]:
    """``config`` with every credential replaced by ``**********`` (safe to log).

    By name (the secret words of :func:`is_secret_name`) and by value: a value holding a secret
    the settings declared (``kafka.secret_keys``, any ``SecretStr``) is masked whatever its key.
    """
    return {
        k: (
            MASK
            if k in SECRET_CONFIG_KEYS or is_secret_name(k)
            else (mask_secret_values(v) if isinstance(v, str) else v)
        )
        for k, v in config.items()
    }


# What a produce's records rely on (docs/design.md §4): the idempotent producer — acks=all, so
# the leader answers once every in-sync replica has a record, and retries that the broker
# de-duplicates by producer id and sequence number, in order (at most 5 requests in flight).
# The produce producer sets these over kafka.client_config, and check_client_config refuses a
# client_config that names them (or librdkafka's aliases of them) rather than ignoring it.
PRODUCE_GUARANTEES: dict[str, str | int | bool] = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "message.send.max.retries": 2147483647,
}
_GUARANTEE_ALIASES = {
    "request.required.acks": "acks",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "retries": "message.send.max.retries",
}

# Properties of the Java client that librdkafka does not have: named in the error, with what to
# set instead, because librdkafka's own message does not name the property.
_JAVA_ONLY = {
    "sasl.jaas.config": "set kafka.sasl_mechanism, kafka.sasl_username and kafka.sasl_password instead",
}


def check_client_config(settings: KafkaSettings, bootstrap_servers: str | None = None) -> None:
    """Raise :class:`KafkaConfigError` if librdkafka refuses the client configuration; no network.

    A client is built from the configuration *without* ``bootstrap.servers`` (so it connects to
    nothing) and closed: every property name, value and SASL mechanism is checked as the real
    clients will check it, but at start, where a typo is a clear error rather than a failure of
    every later request.
    """
    from confluent_kafka import KafkaException, Producer

    config = client_config(settings, bootstrap_servers or "unused:0")
    del config["bootstrap.servers"]
    for name, hint in _JAVA_ONLY.items():
        if name in config:
            raise KafkaConfigError(f"kafka.client_config[{name!r}]: not a librdkafka property; {hint}")
    for name in settings.client_config:
        fixed = _GUARANTEE_ALIASES.get(name, name)
        if fixed in PRODUCE_GUARANTEES:
            raise KafkaConfigError(
                f"kafka.client_config[{name!r}]: the produce producer fixes {fixed}="
                f"{PRODUCE_GUARANTEES[fixed]!r} (the idempotent producer: acks=all, retries the "
                "broker de-duplicates, records kept in order; docs/design.md §4)"
            )
    try:
        Producer({**config, "log_level": "0"}).flush(0)
    except KafkaException as exc:
        detail = exc.args[0].str() if exc.args else repr(exc)
        raise KafkaConfigError(
            f"librdkafka refused the Kafka client settings: {mask_secret_values(detail)}"
        ) from None
