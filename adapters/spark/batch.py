"""The journal analysis as a batch job from Python (what ``purgatory analyze`` runs on files).

::

    from purgatory.adapters.spark.batch import file_lines, run_batch, spark_session

    spark = spark_session("local[*]")
    summary = run_batch(file_lines(spark, "journal/"), "out/", source="journal/")

Needs the ``spark`` extra: importing this module imports PySpark (the package itself does not).
"""

from ._job import RunSummary, run_batch
from ._session import (
    SparkEnvironmentError,
    artifacts_baseline,
    remove_stray_artifacts,
    spark_session,
)
from ._sources import file_lines

__all__ = [
    "RunSummary",
    "SparkEnvironmentError",
    "artifacts_baseline",
    "file_lines",
    "remove_stray_artifacts",
    "run_batch",
    "spark_session",
]
