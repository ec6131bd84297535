"""Prometheus export of every live purgatory's metrics, named as Kafka names them.

Needs the ``metrics`` extra (prometheus-client). A collector reads the live purgatories at scrape
time, so a purgatory's series appear at construction and disappear at shutdown, like Kafka's
``KafkaMetricsGroup`` gauges tagged ``delayedOperation=<name>``.

Names follow what Prometheus' jmx_exporter makes of Kafka's MBeans with its example Kafka
configuration: gauges ``kafka_server_DelayedOperationPurgatory_<Name>``, and Kafka's meters
(``name=ExpiresPerSec``, rule ``name=(.+)PerSec`` → ``kafka_$1_$2_$3_total``) as counters without
the ``PerSec``: ``kafka_server_DelayedOperationPurgatory_Expires_total``. Dashboards built on
a broker's exporter read ours unchanged. (0.1.0 also exported ``..._ExpiresPerSec_total``, the
same count under its deprecated name; it is gone: query ``..._Expires_total``.)

Beyond Kafka: ``purgatory_operation_duration_seconds{delayedOperation, outcome}``, a histogram of
the time from submission to finish. The purgatory keeps its bucket counts itself (a few native
steps per finished operation, see ``purgatory._metrics``); this collector only reads them, so the
per-operation cost is not a ``Histogram.observe`` under a lock. Buckets: 0.25 ms doubling up to
65.5 s, and +Inf.

Registration: ``register_metrics()`` adds the collector to a registry (the default one unless
given); ``KafkaPurgatory.connect`` calls it for you. Purgatories sharing a name (two services
in one process) are summed under that label.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ._metrics import LATENCY_BASE_NS, LATENCY_BUCKETS, OUTCOME_ROWS, live_purgatories

__all__ = ["LATENCY_METRIC", "PurgatoryCollector", "register_metrics"]

_PREFIX = "kafka_server_DelayedOperationPurgatory_"  # Kafka's JMX group and type, Prometheus-style
LATENCY_METRIC = "purgatory_operation_duration_seconds"  # Kafka has no such metric: our own name
# The histogram's ``le`` labels, in seconds: the bounds of purgatory._metrics.latency_bucket.
# repr of the float: what prometheus_client itself writes for a bound (0.00025, ..., 65.536).
_BOUNDS = [*(repr((LATENCY_BASE_NS << k) / 1e9) for k in range(LATENCY_BUCKETS)), "+Inf"]


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
        finished = CounterMetricFamily(
            _PREFIX + "Finished", "Operations finished, by outcome.", labels=["delayedOperation", "outcome"]
        )
        errors = CounterMetricFamily(
            _PREFIX + "UserCodeErrors",
            "Exceptions raised by operations' callbacks (logged; the purgatory kept going).",
            labels=["delayedOperation"],
        )
        latency = HistogramMetricFamily(
            LATENCY_METRIC,
            "Time from submission to finish of the purgatory's operations, by outcome.",
            labels=["delayedOperation", "outcome"],
        )
        # One sample per label set: purgatories sharing a name are summed (duplicate samples
        # would make the exposition invalid).
        totals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        # name -> outcome -> (bucket counts, sum in ns), summed like the counters.
        latencies: dict[str, dict[str, tuple[list[int], int]]] = {}
        for purgatory in live_purgatories():
            counts = totals[purgatory.name]
            counts.update(purgatory.stats.as_dict())
            counts["watched"] += purgatory.watched()
            counts["delayed"] += purgatory.num_delayed()
            summed = latencies.setdefault(purgatory.name, {})
            for outcome, (buckets, sum_ns) in purgatory.stats.latency().items():
                before = summed.get(outcome)
                if before is not None:
                    buckets = [a + b for a, b in zip(before[0], buckets, strict=True)]
                    sum_ns += before[1]
                summed[outcome] = (buckets, sum_ns)
        for name, counts in totals.items():
            size.add_metric([name], counts["watched"])
            delayed.add_metric([name], counts["delayed"])
            expires.add_metric([name], counts["expired"])
            for outcome in OUTCOME_ROWS:
                finished.add_metric([name, outcome], counts[outcome])
                buckets, sum_ns = latencies[name][outcome]
                cumulative = list(itertools.accumulate(buckets))
                latency.add_metric(
                    [name, outcome], list(zip(_BOUNDS, cumulative, strict=True)), sum_value=sum_ns / 1e9
                )
            errors.add_metric([name], counts["user_code_errors"])
        yield from (size, delayed, expires, finished, errors, latency)


_registered: dict[int, PurgatoryCollector] = {}


def register_metrics(registry: CollectorRegistry = REGISTRY) -> PurgatoryCollector:
    """Register the collector with ``registry`` once (idempotent per registry)."""
    collector = _registered.get(id(registry))
    if collector is None:
        collector = PurgatoryCollector()
        registry.register(collector)
        _registered[id(registry)] = collector
    return collector
