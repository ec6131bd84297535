"""One local[2] SparkSession for the whole test session (a JVM start costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from purgatory.adapters.spark._jars import connector_jars
from purgatory.adapters.spark._session import spark_session
from pyspark.sql import SparkSession

TEST_PARTITIONS = 2  # local[2]: one shuffle partition per core, no idle tasks


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # The Kafka connector goes on the classpath now: jars only load when the JVM starts. A clean
    # machine resolves them with Maven here (once; they are cached outside the repository).
    jars = connector_jars(resolve=True)
    session = spark_session(
        "local[2]",
        app_name="purgatory-tests",
        jars=jars,
        shuffle_partitions=TEST_PARTITIONS,
        driver_memory="1g",
        conf={"spark.ui.enabled": "false", "spark.default.parallelism": str(TEST_PARTITIONS)},
    )
    yield session
    session.stop()
