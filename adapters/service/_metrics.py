"""The service's own metrics, next to the purgatories' (read at scrape time: no hot-path cost).

``purgatory_service_fetch_reads_total{source}`` — record reads answered by Kafka or shared from a
span (``SharedReadReader``); ``purgatory_service_feed_polls_total`` and
``purgatory_service_feed_failures_total`` — the change feed's batched polls and failed ones;
``purgatory_service_kafka_unavailable`` — 1 while the last poll could not reach Kafka;
``purgatory_service_kafka_requests_total`` — requests the cluster view sent (what scale-out
divides between instances); ``purgatory_service_watched_partitions`` — partitions each poll asks about;
``purgatory_service_task_free_long_polls_total`` — long polls the protocol-level path served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..kafka import TopicPartitionKey
from ._gateway import Gateway

__all__ = ["ServiceCollector"]


class ServiceCollector(Collector):
    """Reads the current gateway (None before startup and after shutdown: then nothing is exported)."""

    def __init__(self, gateway: Callable[[], Gateway | None]) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Metric]:
        gateway = self._gateway()
        if gateway is None:
            return
        reads = CounterMetricFamily(
            "purgatory_service_fetch_reads", "Record reads of long polls, by source.", labels=["source"]
        )
        reads.add_metric(["kafka"], gateway.reader.kafka_reads)
        reads.add_metric(["shared"], gateway.reader.shared_hits)
        stats = gateway.feed.stats
        polls = CounterMetricFamily("purgatory_service_feed_polls", "Change feed polls (one batch each).")
        polls.add_metric([], stats.polls)
        failures = CounterMetricFamily("purgatory_service_feed_failures", "Change feed polls that failed.")
        failures.add_metric([], stats.failures)
        unavailable = GaugeMetricFamily(
            "purgatory_service_kafka_unavailable", "1 while the change feed cannot reach Kafka."
        )
        unavailable.add_metric([], 1.0 if gateway.feed.unavailable else 0.0)
        requests = CounterMetricFamily(
            "purgatory_service_kafka_requests",
            "Requests the cluster view sent to Kafka (the feed's batches).",
        )
        requests.add_metric([], gateway.view.requests_sent)
        watched = GaugeMetricFamily(
            "purgatory_service_watched_partitions",
            "Partitions the change feed polls (each poll asks about all).",
        )
        watched.add_metric([], sum(isinstance(k, TopicPartitionKey) for k in gateway.feed.watched_keys()))
        task_free = CounterMetricFamily(
            "purgatory_service_task_free_long_polls",
            "Long polls served below the ASGI app (service.fast_long_poll): no task waited for them.",
        )
        task_free.add_metric([], gateway.task_free_fetches)
        yield from (reads, polls, failures, unavailable, requests, watched, task_free)
