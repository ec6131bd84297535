"""Prometheus export of every live purgatory's metrics, named as Kafka names them.

Needs the ``metrics`` extra (prometheus-client). A collector reads the live purgatories at scrape
time, so a purgatory's series appear at construction and disappear at shutdown, like Kafka's
``KafkaMetricsGroup`` gauges tagged ``delayedOperation=<name>``.

Names follow what Prometheus' jmx_exporter makes of Kafka's MBeans with its example Kafka
configuration: gauges ``kafka_server_DelayedOperationPurgatory_<Name>``, and Kafka's meters
(``name=ExpiresPerSec``, rule ``name=(.+)PerSec`` → ``kafka_$1_$2_$3_total``) as counters without
the ``PerSec``: ``kafka_server_DelayedOperationPurgatory_Expires_total``. Dashboards built on
a broker's exporter read ours unchanged. ``..._ExpiresPerSec_total`` is still exported (same
value, deprecated) for dashboards built on earlier releases.

Registration: ``register_metrics()`` adds the collector to a registry (the default one unless
given); ``KafkaPurgatory.connect`` calls it for you. Purgatories sharing a name (two services
in one process) are summed under that label.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ._metrics import live_purgatories

__all__ = ["PurgatoryCollector", "register_metrics"]

_PREFIX = "kafka_server_DelayedOperationPurgatory_"  # Kafka's JMX group and type, Prometheus-style


class PurgatoryCollector(Collector):
    """``PurgatorySize``, ``NumDelayedOperations``, expirations, outcomes and user-code errors."""

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            _PREFIX + "PurgatorySize",
            "Watcher entries, completed-but-unpurged included (Kafka's PurgatorySize).",
            labels=["delayedOperation"],
        )
        delayed = GaugeMetricFamily(
            _PREFIX + "NumDelayedOperations",
            "Operations waiting in the timer (Kafka's NumDelayedOperations).",
            labels=["delayedOperation"],
        )
        expires = CounterMetricFamily(
            _PREFIX + "Expires",
            "Operations finished by expiry (Kafka's ExpiresPerSec meter, as jmx_exporter names it).",
            labels=["delayedOperation"],
        )
        expires_per_sec = CounterMetricFamily(
            _PREFIX + "ExpiresPerSec",
            "Deprecated: the same count as ..._Expires_total (name of earlier releases).",
            labels=["delayedOperation"],
        )
        finished = CounterMetricFamily(
            _PREFIX + "Finished", "Operations finished, by outcome.", labels=["delayedOperation", "outcome"]
        )
        errors = CounterMetricFamily(
            _PREFIX + "UserCodeErrors",
            "Exceptions raised by operations' callbacks (logged; the purgatory kept going).",
            labels=["delayedOperation"],
        )
        # One sample per label set: purgatories sharing a name are summed (duplicate samples
        # would make the exposition invalid).
        totals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for purgatory in live_purgatories():
            counts = totals[purgatory.name]
            counts.update(purgatory.stats.as_dict())
            counts["watched"] += purgatory.watched()
            counts["delayed"] += purgatory.num_delayed()
        for name, counts in totals.items():
            size.add_metric([name], counts["watched"])
            delayed.add_metric([name], counts["delayed"])
            expires.add_metric([name], counts["expired"])
            expires_per_sec.add_metric([name], counts["expired"])
            for outcome in ("completed", "expired", "cancelled"):
                finished.add_metric([name, outcome], counts[outcome])
            errors.add_metric([name], counts["user_code_errors"])
        yield from (size, delayed, expires, expires_per_sec, finished, errors)


_registered: dict[int, PurgatoryCollector] = {}


def register_metrics(registry: CollectorRegistry = REGISTRY) -> PurgatoryCollector:
    """Register the collector with ``registry`` once (idempotent per registry)."""
    collector = _registered.get(id(registry))
    if collector is None:
        collector = PurgatoryCollector()
        registry.register(collector)
        _registered[id(registry)] = collector
    return collector
