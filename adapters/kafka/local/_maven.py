"""Apache Kafka's runtime jars for the local cluster, resolved once per version with Maven.

The pom (``pom.xml`` beside this module) names the broker; the shared resolver
(``purgatory.adapters._maven``, also used for Spark's connector) copies its runtime classpath
into ``<cache>/kafka-<version>/libs``.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import structlog

from ..._maven import MavenError, copy_dependencies, is_resolved
from ..clients._errors import KafkaLauncherError

__all__ = ["CACHE_ENV", "DEFAULT_KAFKA_VERSION", "VERSION_ENV", "cache_dir", "resolve_kafka"]

_log = structlog.get_logger("purgatory.kafka.local")

# The newest Apache Kafka 4.x whose full runtime classpath Maven Central serves (4.4.0's pom
# names a kafka-tools-api 4.4.0 that Central does not have, as of writing). Java 17 runs it.
DEFAULT_KAFKA_VERSION = "4.3.1"
CACHE_ENV = "PURGATORY_KAFKA_CACHE"
VERSION_ENV = "PURGATORY_KAFKA_VERSION"
MAVEN_TIMEOUT_S = 600.0  # a cold ~/.m2 downloads ~45 MB of jars; bounded all the same


def cache_dir() -> Path:
    """Where resolved Kafka jars and local clusters live (outside git)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kafka-purgatory"


def _pom_path() -> Path:
    # Shipped as package data next to this module; as_file gives a real path even from a zip.
    ref = resources.files(__package__ or "purgatory.adapters.kafka.local").joinpath("pom.xml")
    with resources.as_file(ref) as path:
        return Path(path)


def resolve_kafka(version: str | None = None, *, offline_ok: bool = True) -> Path:
    """Return the directory of Kafka ``version``'s runtime jars, resolving them with Maven once.

    Raises :class:`KafkaLauncherError` when Maven is missing or the resolution fails (with the
    tail of Maven's output).
    """
    version = version or os.environ.get(VERSION_ENV) or DEFAULT_KAFKA_VERSION
    libs = cache_dir() / f"kafka-{version}" / "libs"
    if is_resolved(libs):
        return libs
    _log.info("kafka_resolving", version=version, into=str(libs))
    try:
        return copy_dependencies(
            _pom_path(),
            libs,
            {"kafka.version": version, "includeScope": "runtime"},
            expect="kafka_2.13-*.jar",
            what=f"Apache Kafka {version}",
            timeout_s=MAVEN_TIMEOUT_S,
        )
    except MavenError as exc:
        raise KafkaLauncherError(str(exc)) from None
