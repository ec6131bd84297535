"""Prometheus export of every live purgatory's metrics, named as Kafka names them.

Needs the ``metrics`` extra (prometheus-client). A collector reads the live purgatories at scrape
time, so a purgatory's series appear at construction and disappear at shutdown, like Kafka's
``KafkaMetricsGroup`` gauges tagged ``delayedOperation=<name>``.
"""

from __future__ import annotations

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
            _PREFIX + "ExpiresPerSec", "Operations finished by expiry.", labels=["delayedOperation"]
        )
        finished = CounterMetricFamily(
            _PREFIX + "Finished", "Operations finished, by outcome.", labels=["delayedOperation", "outcome"]
        )
        errors = CounterMetricFamily(
            _PREFIX + "UserCodeErrors",
            "Exceptions raised by operations' callbacks (logged; the purgatory kept going).",
            labels=["delayedOperation"],
        )
        for purgatory in live_purgatories():
            name = purgatory.name
            stats = purgatory.stats.as_dict()
            size.add_metric([name], purgatory.watched())
            delayed.add_metric([name], purgatory.num_delayed())
            expires.add_metric([name], stats["expired"])
            for outcome in ("completed", "expired", "cancelled"):
                finished.add_metric([name, outcome], stats[outcome])
            errors.add_metric([name], stats["user_code_errors"])
        yield from (size, delayed, expires, finished, errors)


_registered: dict[int, PurgatoryCollector] = {}


def register_metrics(registry: CollectorRegistry = REGISTRY) -> PurgatoryCollector:
    """Register the collector with ``registry`` once (idempotent per registry)."""
    collector = _registered.get(id(registry))
    if collector is None:
        collector = PurgatoryCollector()
        registry.register(collector)
        _registered[id(registry)] = collector
    return collector
