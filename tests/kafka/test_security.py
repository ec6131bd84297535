"""Security: SASL/SSL secrets never appear in logs, reprs, settings dumps or exception messages.

One scenario sets the secrets (one from TOML, one from the environment), then exercises every
place a secret could escape — settings reprs and dumps, ``purgatory config show``, ConfigError
messages, the Kafka adapter's clients (which do receive the secrets) and their log events, the
rendered JSON log lines of ``configure_logging`` — and collects every string produced. A final
scan looks for the secrets in all of it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from purgatory.tools.reliability import isolated_environment
from structlog.testing import capture_logs
from typer.testing import CliRunner

import purgatory._logging as purgatory_logging
from purgatory.settings import ConfigError, Settings, load_settings

SASL_PASSWORD = f"sasl-pw-{uuid.uuid4().hex}"
SSL_KEY_PASSWORD = f"ssl-key-pw-{uuid.uuid4().hex}"
SECRETS = (SASL_PASSWORD, SSL_KEY_PASSWORD)
UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1: the adapters fail fast, no cluster needed
SHORT_TIMEOUT_MS = 300


def _scan(captured: dict[str, str], secrets: tuple[str, ...] = SECRETS) -> None:
    assert captured, "nothing was captured"
    leaks = [(where, secret) for where, text in captured.items() for secret in secrets if secret in text]
    assert not leaks, f"secrets leaked in: {[where for where, _ in leaks]}"


@pytest.fixture
def secret_config(tmp_path: Path) -> Iterator[Path]:
    config = tmp_path / "secure.toml"
    config.write_text(
        "[kafka]\n"
        'security_protocol = "SASL_SSL"\n'
        'sasl_mechanism = "PLAIN"\n'
        'sasl_username = "svc-purgatory"\n'
        f'sasl_password = "{SASL_PASSWORD}"\n'
    )
    with isolated_environment({"PURGATORY_KAFKA__SSL_KEY_PASSWORD": SSL_KEY_PASSWORD}):
        yield config


def _adapter_activity(settings: Settings, captured: dict[str, str], tag: str) -> None:
    """Use every Kafka client the adapter builds from these settings, against nothing."""
    from purgatory.adapters.kafka import ClusterView, KafkaUnavailableError, TopicKey, client_config
    from purgatory.adapters.kafka.journal_sink import KafkaJournalSink

    kafka = settings.kafka.model_copy(update={"security_protocol": "SASL_PLAINTEXT"})  # no CA files here
    view = ClusterView(kafka, bootstrap_servers=UNREACHABLE, request_timeout_ms=SHORT_TIMEOUT_MS)
    try:
        assert view.admin is not None
        captured[f"{tag}: repr(view)"] = repr(view)
        with pytest.raises(KafkaUnavailableError) as info:
            view.facts(topics=[TopicKey("secure-topic")])
        captured[f"{tag}: KafkaUnavailableError"] = f"{info.value!s} {info.value!r}"
    finally:
        view.close()
    config = client_config(kafka, UNREACHABLE)
    assert config["sasl.password"] == SASL_PASSWORD, "the client itself must get the secret"
    sink = KafkaJournalSink({**config, "message.timeout.ms": str(SHORT_TIMEOUT_MS)}, "journal")
    try:
        sink.write([])
        captured[f"{tag}: repr(sink)"] = repr(sink)
    finally:
        sink.close()


def test_secrets_never_appear_in_logs_reprs_dumps_or_errors(
    secret_config: Path, restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    captured: dict[str, str] = {}

    # Settings: reprs and every dump.
    settings = load_settings(secret_config)
    assert settings.kafka.sasl_password is not None and settings.kafka.ssl_key_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == SASL_PASSWORD, "the secret is loaded"
    assert settings.kafka.ssl_key_password.get_secret_value() == SSL_KEY_PASSWORD
    captured["repr(settings)"] = repr(settings)
    captured["str(settings)"] = str(settings)
    captured["repr(settings.kafka)"] = repr(settings.kafka)
    captured["model_dump()"] = str(settings.model_dump())
    captured["model_dump(json)"] = json.dumps(settings.model_dump(mode="json"))
    captured["model_dump_json()"] = settings.model_dump_json()

    # `purgatory config show`.
    from purgatory.cli import app

    result = CliRunner().invoke(app, ["config", "show", "--config", str(secret_config)])
    assert result.exit_code == 0, result.output
    assert "svc-purgatory" in result.output, "config show prints the settings"
    captured["purgatory config show"] = result.output

    # ConfigError messages: another field wrong, and the secret fields themselves wrong.
    bad_inputs = {
        "other field invalid": ({"PURGATORY_TIMER__TICK_MS": "0"}, None),
        "secret as a list": ({}, f'[kafka]\nsasl_password = ["{SASL_PASSWORD}"]\n'),
        "secret as a table": ({}, f'[kafka]\nssl_key_password = {{ v = "{SSL_KEY_PASSWORD}" }}\n'),
        "secret next to a bad value": (
            {"PURGATORY_KAFKA": json.dumps({"sasl_password": SASL_PASSWORD, "feed_interval_ms": 0})},
            None,
        ),
    }
    for name, (env, toml) in bad_inputs.items():
        path = secret_config
        if toml is not None:
            path = secret_config.with_name(f"{abs(hash(name))}.toml")
            path.write_text(toml)
        # The environment wins over the file: a TOML case must not have the variable set too.
        base = {} if toml is not None else {"PURGATORY_KAFKA__SSL_KEY_PASSWORD": SSL_KEY_PASSWORD}
        with isolated_environment({**base, **env}):
            with pytest.raises(ConfigError) as info:
                load_settings(path)
            captured[f"ConfigError: {name}"] = f"{info.value!s} {info.value!r}"
            bad = CliRunner().invoke(app, ["config", "show", "--config", str(path)])
            assert bad.exit_code == 2
            captured[f"config show: {name}"] = bad.output

    # Log events, as structlog hands them to processors (before any masking), DEBUG included.
    purgatory_logging.configure_logging("DEBUG", "json", force=True)
    with capture_logs() as logs:
        _adapter_activity(settings, captured, "captured")
    assert any(log["event"] == "kafka_admin_connect" for log in logs), "the admin client logs its config"
    assert any(log["event"] == "journal_producer_started" for log in logs)
    captured["capture_logs"] = json.dumps(logs, default=repr)

    # Rendered JSON lines of the production configuration.
    capsys.readouterr()
    _adapter_activity(settings, captured, "rendered")
    log = structlog.get_logger("security-test")
    log.info("login", password=SASL_PASSWORD, sasl_password=SASL_PASSWORD, ssl_key_password=SSL_KEY_PASSWORD)
    log.info("settings_loaded", settings=settings, kafka=settings.kafka)
    try:
        raise RuntimeError(f"connection refused for user {settings.kafka.sasl_username}")
    except RuntimeError:
        log.exception("connect_failed", kafka=settings.kafka)
    out = capsys.readouterr()
    rendered = out.out + out.err
    assert '"event": "kafka_admin_connect"' in rendered, "the JSON renderer wrote the adapter's lines"
    assert '"event": "login"' in rendered
    captured["rendered JSON"] = rendered
    _scan(captured)


# -- gaps found by this suite, now fixed -------------------------------------------------------


def test_credentials_passed_through_client_config_are_masked_in_dumps() -> None:
    secret = f"passthrough-{uuid.uuid4().hex}"
    variables = {"PURGATORY_KAFKA__CLIENT_CONFIG": json.dumps({"sasl.password": secret})}
    with isolated_environment(variables):
        settings = load_settings()
        from purgatory.cli import app

        shown = CliRunner().invoke(app, ["config", "show"]).output
    _scan({"repr": repr(settings), "config show": shown}, (secret,))


def test_redacted_config_masks_private_keys_and_oauth_config() -> None:
    from purgatory.adapters.kafka import redacted

    key = f"-----BEGIN PRIVATE KEY----- {uuid.uuid4().hex}"
    oauth = f"clientId=svc clientSecret={uuid.uuid4().hex}"
    shown: dict[str, Any] = redacted({"ssl.key.pem": key, "sasl.oauthbearer.config": oauth})
    _scan({"redacted": json.dumps(shown)}, (key, oauth))


def test_a_misspelt_secret_field_does_not_echo_its_value(tmp_path: Path) -> None:
    secret = f"typo-{uuid.uuid4().hex}"
    config = tmp_path / "typo.toml"
    config.write_text(f'[kafka]\nsasl_pasword = "{secret}"\n')
    with isolated_environment(), pytest.raises(ConfigError) as info:
        load_settings(config)
    assert "sasl_pasword" in str(info.value)
    _scan({"ConfigError": str(info.value)}, (secret,))


def test_console_log_tracebacks_do_not_print_local_variables(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    purgatory_logging.configure_logging("INFO", "console", force=True)
    capsys.readouterr()

    def connect(password: str) -> None:
        raise ConnectionError("authentication failed")

    try:
        connect(SASL_PASSWORD)
    except ConnectionError:
        structlog.get_logger("security-test").exception("connect_failed")
    out = capsys.readouterr()
    rendered = out.out + out.err
    assert "connect_failed" in rendered and "authentication failed" in rendered
    _scan({"console traceback": rendered})
