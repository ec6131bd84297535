"""The Spark analytics' benchmark: rows/s of the batch journal job (``pipeline``, ``purgatory bench
pipeline``)."""
