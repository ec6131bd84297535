"""Shared fixtures: every test must leave no purgatory thread behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import structlog

import purgatory._logging as purgatory_logging

# Real Kafka for every test directory: the single-broker cluster is started once per session
# (provider order of docs/design.md §5), only when a test asks for one of these fixtures.
from tests.kafka.kafka_fixtures import (  # noqa: F401
    kafka_bootstrap,
    kafka_cluster,
    kafka_cluster1,
    kafka_cluster3,
    kafka_settings,
    kafka_topic_factory,
)


@pytest.fixture(autouse=True)
def _no_leaked_purgatory_threads() -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [
        t.name
        for t in threading.enumerate()
        if t.ident not in before
        and t.is_alive()
        and (t.name.startswith("ExpirationReaper-") or t.name.startswith("executor-"))
    ]
    assert not leaked, f"test left purgatory threads running: {leaked}"


@pytest.fixture(autouse=True)
def _structlog_config_restored() -> Iterator[None]:
    """A test that runs a CLI command or ``KafkaPurgatory.connect()`` configures logging for the
    process (its level filter included); restore the configuration so a later test's
    ``capture_logs`` still sees info lines, whatever the order the directories run in. An
    unconfigured structlog is restored as unconfigured (connect() only configures that one)."""
    saved = structlog.get_config()
    was_configured = structlog.is_configured()
    yield
    if was_configured:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """For a test that configures logging on purpose (``force=True``): structlog's configuration
    and the logging module's once-flag are put back afterwards."""
    saved, done = structlog.get_config(), purgatory_logging._done
    try:
        yield
    finally:
        structlog.configure(**saved)
        purgatory_logging._done = done
