"""Spark's Kafka connector jars: resolved ahead of time with Maven, handed to Spark as ``spark.jars``.

Spark's own ``--packages`` would resolve them with Ivy at every cold start, needing the network
then. Instead ``pom.xml`` (next to this file) lists the connector; Maven copies it and its runtime
dependencies (minus what PySpark already ships) into a per-version cache outside the repository:
``~/.cache/kafka-purgatory/spark-kafka/<pyspark version>/`` (``PURGATORY_SPARK_JARS_DIR``
overrides the base). The jars must match PySpark's version exactly. Maven runs through the
adapters' one resolver (``purgatory.adapters._maven``), the one that resolves the local Kafka.
"""

from __future__ import annotations

import os
import shlex
import shutil
from importlib.metadata import version
from pathlib import Path

from purgatory import PurgatoryError

from .._maven import MavenError, copy_dependencies, maven_command

__all__ = [
    "CONNECTOR_ARTIFACT",
    "ConnectorJarsMissingError",
    "connector_jars",
    "jars_dir",
    "resolve_command",
]

CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"
JARS_DIR_ENV = "PURGATORY_SPARK_JARS_DIR"
DEFAULT_BASE = Path("~/.cache/kafka-purgatory/spark-kafka")
RESOLVE_TIMEOUT_S = 600  # a cold Maven cache downloads ~15 MB of jars and poms


class ConnectorJarsMissingError(PurgatoryError):
    """The Kafka connector jars are not in the cache; the message gives the command to run."""


def pyspark_version() -> str:
    return version("pyspark")


def jars_dir(spark_version: str | None = None) -> Path:
    base = Path(os.environ.get(JARS_DIR_ENV) or DEFAULT_BASE).expanduser()
    return base / (spark_version or pyspark_version())


def pom_path() -> Path:
    return Path(__file__).with_name("pom.xml")


def resolve_command(spark_version: str | None = None) -> list[str]:
    """The Maven command that fills the cache for ``spark_version`` (default: PySpark's)."""
    spark_version = spark_version or pyspark_version()
    return maven_command(pom_path(), jars_dir(spark_version), {"spark.version": spark_version})


def _cached(spark_version: str) -> list[Path]:
    directory = jars_dir(spark_version)
    jars = sorted(directory.glob("*.jar"))
    if not (directory / f"{CONNECTOR_ARTIFACT}-{spark_version}.jar").is_file():
        return []
    return jars


def connector_jars(spark_version: str | None = None, *, resolve: bool = False) -> list[Path]:
    """The cached connector jars; with ``resolve``, run Maven first when they are missing.

    Raises :class:`ConnectorJarsMissingError` (with the exact command) when they are missing and
    ``resolve`` is False, or Maven is not installed, or Maven failed (with its output).
    """
    spark_version = spark_version or pyspark_version()
    jars = _cached(spark_version)
    if jars:
        return jars
    command = resolve_command(spark_version)
    if not resolve:
        raise ConnectorJarsMissingError(
            f"Spark's Kafka connector ({CONNECTOR_ARTIFACT} {spark_version}) is not in "
            f"{jars_dir(spark_version)}. Resolve it once with Maven (Java 17 and network to Maven "
            f"Central needed):\n\n    {shlex.join(command)}\n"
        )
    if shutil.which("mvn") is None:
        raise ConnectorJarsMissingError(
            f"Maven (mvn) is not on PATH; install it, then run:\n\n    {shlex.join(command)}\n"
        )
    try:
        copy_dependencies(
            pom_path(),
            jars_dir(spark_version),
            {"spark.version": spark_version},
            expect=f"{CONNECTOR_ARTIFACT}-{spark_version}.jar",
            what=f"Spark's Kafka connector ({CONNECTOR_ARTIFACT} {spark_version})",
            timeout_s=RESOLVE_TIMEOUT_S,
        )
    except MavenError as exc:
        raise ConnectorJarsMissingError(str(exc)) from None
    jars = _cached(spark_version)
    if not jars:
        raise ConnectorJarsMissingError(f"Maven ran but {jars_dir(spark_version)} has no connector jar")
    return jars
