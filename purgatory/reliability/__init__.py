"""The reliability harness behind ``purgatory bench reliability`` and ``tests/reliability``.

Soak load (:func:`run_soak`), the bad-input matrix, fault scenarios and the report they print.
The core never imports a Kafka client here: Kafka fault scenarios import the adapter inside the
functions that need it.
"""

from ._soak import SoakResult, rss_bytes, run_soak

__all__ = ["SoakResult", "rss_bytes", "run_soak"]
