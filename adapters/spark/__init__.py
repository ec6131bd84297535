"""Journal analytics on PySpark (docs/design.md §6): ``purgatory analyze`` and ``purgatory bench pipeline``.

Modules, one job each: ``_session`` (SparkSession and its environment), ``_jars`` (the Kafka
connector resolved ahead of time with Maven, ``pom.xml``), ``_sources`` (journal lines from files
or Kafka), ``_parse`` (lines → events and bad records), ``_analysis`` (windowed aggregates),
``_job`` (batch run and streaming queries), ``_report`` (report.html), ``cli`` and ``bench``.
Nothing is imported here: the CLI loads this package's entry points on every invocation, and
PySpark is imported only when a command needs it.
"""
