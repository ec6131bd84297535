"""Secrets masked by name *and* by value: ``purgatory config show``, logs, the adapters' configs.

Names: a ``kafka.client_config`` key with a credential word (``my.apikey``) or listed in
``kafka.secret_keys`` is held as a SecretStr. Values: every secret the settings hold is masked
wherever it appears, also in text that does not name it (a log message, an error, a traceback).
"""

from __future__ import annotations

import json
import uuid

import pytest
import structlog
from purgatory.adapters.kafka.settings import KafkaSettings
from typer.testing import CliRunner

import purgatory._logging as purgatory_logging
from purgatory._secrets import MASK, MIN_MASKED_CHARS, is_secret_name, mask_secret_values
from purgatory.cli import app
from purgatory.settings import Settings

runner = CliRunner()


def _secret(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    "name",
    [
        "my.apikey",
        "my.api_key",
        "sasl.password",
        "ssl.key.pem",
        "ssl.keystore.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.jaas.config",
        "schema.registry.basic.auth.credentials.source",
        "vault.TOKEN",
        "private.material",
    ],
)
def test_credential_words_mark_a_name_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["bootstrap.servers", "client.id", "linger.ms", "acks", "security.protocol"])
def test_ordinary_client_properties_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("PURGATORY_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_config_show_masks_my_apikey_and_declared_secret_keys(clean_env: pytest.MonkeyPatch) -> None:
    apikey, custom, plain = _secret("apikey"), _secret("custom"), "kafka-purgatory-client"
    clean_env.setenv(
        "PURGATORY_KAFKA__CLIENT_CONFIG",
        json.dumps({"my.apikey": apikey, "vendor.thing": custom, "client.id": plain}),
    )
    clean_env.setenv("PURGATORY_KAFKA__SECRET_KEYS", '["vendor.thing"]')
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    assert apikey not in result.output and custom not in result.output
    shown = json.loads(result.stdout)["kafka"]["client_config"]
    assert shown == {"my.apikey": MASK, "vendor.thing": MASK, "client.id": plain}


def test_a_secret_value_is_masked_in_config_show_under_any_name(clean_env: pytest.MonkeyPatch) -> None:
    token = _secret("token")
    clean_env.setenv("PURGATORY_KAFKA__SASL_PASSWORD", token)
    clean_env.setenv("PURGATORY_KAFKA__SASL_USERNAME", token)  # the same value under a plain name
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    assert token not in result.output
    assert json.loads(result.stdout)["kafka"]["sasl_username"] == MASK


def test_settings_secrets_are_masked_by_value_in_any_text() -> None:
    apikey, service_token = _secret("apikey"), _secret("bearer")
    Settings(
        kafka=KafkaSettings(client_config={"my.apikey": apikey}),
        service={"auth_tokens": [service_token]},  # type: ignore[arg-type]
    )
    text = f"librdkafka said: invalid value {apikey!r}; header Bearer {service_token}"
    masked = mask_secret_values(text)
    assert apikey not in masked and service_token not in masked
    assert masked.count(MASK) == 2 and masked.startswith("librdkafka said")


def test_very_short_values_are_not_masked_by_value() -> None:
    KafkaSettings(client_config={"my.apikey": "ab"})
    assert mask_secret_values("ab" * MIN_MASKED_CHARS) == "ab" * MIN_MASKED_CHARS


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_log_lines_mask_secret_values_in_messages_fields_and_tracebacks(
    restore_logging: None, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    apikey = _secret("apikey")
    KafkaSettings(client_config={"my.apikey": apikey})
    purgatory_logging.configure_logging("INFO", fmt, force=True)  # type: ignore[arg-type]
    log = structlog.get_logger("test")
    log.info(f"connecting with {apikey}", config={"my.apikey": apikey, "nested": [apikey]})
    try:
        raise ValueError(f"bad value {apikey}")
    except ValueError:
        log.exception("failed")
    err = capsys.readouterr().err
    assert "connecting with" in err and "failed" in err
    assert apikey not in err
    assert MASK in err
