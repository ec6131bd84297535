"""``serve`` applies ``log.*``: JSON at the configured level, not structlog's console at DEBUG.

Unconfigured, structlog renders to the console at DEBUG with rich tracebacks that show local
variables; the gateway leaves logging to its host, so the process that starts the service must
apply the settings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import structlog
from purgatory.adapters.service import serve

from purgatory.settings import Settings


@pytest.fixture
def unconfigured() -> Iterator[None]:
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def test_serve_applies_the_log_format_and_level(
    unconfigured: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PURGATORY_LOG__FORMAT", "json")
    monkeypatch.setenv("PURGATORY_LOG__LEVEL", "INFO")
    monkeypatch.setenv("PURGATORY_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")  # never reached: run() is stubbed
    ran: list[bool] = []
    monkeypatch.setattr(serve.ReleasingServer, "run", lambda self, sockets=None: ran.append(True))
    assert serve.main(["--port", "0"]) == 0 and ran
    log = structlog.get_logger("purgatory.service")
    log.debug("hidden_at_info")
    log.info("shown", detail=1)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["shown"], lines


async def test_the_apps_lifespan_applies_log_settings_when_nobody_did(unconfigured: None) -> None:
    from purgatory.adapters.service.app._app import apply_log_settings

    apply_log_settings(
        Settings.model_validate({"log": {"level": "WARNING", "format": "json"}}), override=False
    )
    assert structlog.is_configured()
    assert not structlog.get_logger().is_enabled_for(20)  # type: ignore[attr-defined]
