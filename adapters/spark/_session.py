"""The SparkSession of the journal pipeline: environment, connector jars, sane local defaults."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from purgatory import PurgatoryError

__all__ = [
    "SparkEnvironmentError",
    "artifacts_baseline",
    "prepare_environment",
    "remove_stray_artifacts",
    "spark_session",
]

LOOPBACK = "127.0.0.1"  # Spark binds the driver here: no surprises from the host's other interfaces
DEFAULT_SHUFFLE_PARTITIONS = 8  # journals are small next to Spark's default of 200 (one task each)
DEFAULT_DRIVER_MEMORY = "2g"  # local mode runs everything in the driver JVM; 1g (Spark's) is tight
# Input split size: a 64 MiB journal segment becomes two tasks, so a few segments keep every core
# busy to the end instead of one core finishing a lone 128 MiB split (Spark's default) alone.
DEFAULT_MAX_PARTITION_BYTES = "32m"
QUIET_LOG4J2 = Path(__file__).with_name("log4j2.properties")  # errors only, to stderr
# Spark 4's driver makes ``artifacts/spark-<uuid>/`` in the JVM's working directory (its
# ArtifactManager, for Spark Connect's uploads) and leaves it behind, empty, at stop.
ARTIFACTS_DIR = "artifacts"


class SparkEnvironmentError(PurgatoryError):
    """Spark cannot start here (no Java); the message says what to install."""


def prepare_environment() -> None:
    """Set what PySpark needs before its JVM starts (only where the user did not set it)."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    # Python workers must run this interpreter (the venv), not whatever ``python3`` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").exists()) and shutil.which("java") is None:
        raise SparkEnvironmentError(
            "Spark needs a Java runtime (17 or 21) and none was found: set JAVA_HOME or put `java` "
            "on PATH (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
        )


def spark_session(
    master: str = "local[*]",
    *,
    app_name: str = "purgatory-analyze",
    jars: Sequence[Path] = (),
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """Get or create the session. Settings that need a fresh JVM (jars, driver memory) only apply
    to the first session of the process (Spark's rule); later calls return that session."""
    prepare_environment()
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")  # windows and report times in UTC
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
        .config("spark.ui.showConsoleProgress", "false")  # progress bars garble the CLI's output
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.files.maxPartitionBytes", DEFAULT_MAX_PARTITION_BYTES)
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in jars))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if not any(key == "spark.driver.extraJavaOptions" for key in (conf or {})):
        # Spark's startup WARN lines (native Hadoop, loopback address...) are printed before any
        # setLogLevel could run: the driver JVM starts with our quiet log4j2 configuration.
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={QUIET_LOG4J2}"
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session


def artifacts_baseline(cwd: Path | None = None) -> frozenset[Path] | None:
    """What ``artifacts/`` in ``cwd`` (default: the working directory) holds before a session
    starts; None if it does not exist. Hand it to :func:`remove_stray_artifacts` after ``stop()``."""
    root = (cwd or Path.cwd()) / ARTIFACTS_DIR
    return frozenset(root.iterdir()) if root.is_dir() else None


def remove_stray_artifacts(before: frozenset[Path] | None, cwd: Path | None = None) -> None:
    """Remove the ``artifacts/spark-*`` directories a session left in ``cwd`` since ``before``,
    and ``artifacts/`` itself if this run made it — only directories that hold no file: a
    command writes only where it was told to (``--out``), and never deletes anything of the user's."""
    root = (cwd or Path.cwd()) / ARTIFACTS_DIR
    if not root.is_dir():
        return
    for child in root.iterdir():
        if before is not None and child in before:
            continue
        if (
            child.is_dir()
            and child.name.startswith("spark-")
            and not any(p.is_file() for p in child.rglob("*"))
        ):
            shutil.rmtree(child, ignore_errors=True)
    if before is None and not any(root.iterdir()):
        root.rmdir()
