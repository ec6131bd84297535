"""librdkafka configurations built from :class:`purgatory.settings.KafkaSettings`.

Secrets are unwrapped from ``SecretStr`` only here, into the dict handed to librdkafka;
:func:`redacted` is the only form of a config that may be logged.
"""

from __future__ import annotations

from collections.abc import Mapping

from purgatory.settings import KafkaSettings, is_secret_name

__all__ = ["SECRET_CONFIG_KEYS", "client_config", "redacted"]

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
    """``config`` with every credential replaced by ``**********`` (safe to log)."""
    return {
        k: ("**********" if k in SECRET_CONFIG_KEYS or is_secret_name(k) else v) for k, v in config.items()
    }
