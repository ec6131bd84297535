"""The Kafka adapter's own metrics: answers per status, and the change feed's health.

``purgatory_kafka_answers_total{operation, status}`` — every answer a Kafka operation gave its
caller (``KafkaPurgatory`` / ``AsyncKafkaPurgatory``, the HTTP service's too), by operation type
(``DelayedProduce``, ``DelayedFetch``, ...) and status (:meth:`KafkaOperation.answer_code`:
``NONE`` for success, else Kafka's error name, or ours: ``KAFKA_UNAVAILABLE``, ``SHUTTING_DOWN``).
Refusals answered before any wait (an unknown partition, shutting down) are counted like the rest:
each operation is counted once, when it finishes (``KafkaOperation.on_complete``).

Feed health, per live :class:`KafkaPurgatory` (label ``name``, its ``connect(name=...)``):
``purgatory_kafka_feed_last_success_age_seconds`` — seconds since the change feed last refreshed
its facts from Kafka (grows through an outage; the feed polls only while something is watched,
so an idle purgatory's age grows too); ``purgatory_kafka_unavailable`` — 1 while the last poll
could not reach Kafka. :func:`feed_health` builds both for any prefix: the HTTP service exports
the same two under its own names (``purgatory_service_...``) from the same code.

Counting costs a lock and a dict update per finished operation; the Prometheus families are
built at scrape time only. ``prometheus-client`` is imported only when a scrape runs, so the
adapter works without the ``metrics`` extra (nothing is then exported, the counts are kept).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client.core import Metric
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "ANSWERS",
    "AnswerCounts",
    "FeedHealth",
    "KafkaCollector",
    "feed_health",
    "live_feeds",
    "register_kafka_metrics",
    "track_feed",
    "untrack_feed",
]

ANSWERS_METRIC = "purgatory_kafka_answers"
FEED_HEALTH_METRICS = ("purgatory_kafka_unavailable", "purgatory_kafka_feed_last_success_age_seconds")


class FeedHealth(Protocol):
    """What the health gauges read of a change feed (:class:`ChangeFeed` has these)."""

    @property
    def unavailable(self) -> str | None: ...

    @property
    def stats(self) -> Any: ...  # FeedStats: ``last_success`` (time.monotonic())


class AnswerCounts:
    """Answers per (operation type, status), process-wide.

    Concurrency contract: ``count`` from any thread (finishing threads, event loops); the lock
    makes the read-modify-write of one count atomic (a plain dict update could lose counts
    between two threads finishing operations at once).
    """

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def count(self, operation: str, status: str) -> None:
        key = (operation, status)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


ANSWERS = AnswerCounts()  # what KafkaOperation.on_complete counts into


class FeedOwner(Protocol):
    """What is tracked: a named owner of a change feed (:class:`KafkaPurgatory`)."""

    name: str

    @property
    def feed(self) -> Any: ...


# Live KafkaPurgatory instances: weak, so one nobody holds stops being exported; close() untracks.
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_live_lock = threading.Lock()


def track_feed(owner: FeedOwner) -> None:
    """Export ``owner.feed``'s health under ``owner.name`` until :func:`untrack_feed` (or it is gone)."""
    with _live_lock:
        _live.add(owner)


def untrack_feed(owner: FeedOwner) -> None:
    with _live_lock:
        _live.discard(owner)


def live_feeds() -> list[tuple[str, FeedHealth]]:
    """The tracked owners' names and feeds."""
    with _live_lock:
        owners = list(_live)
    return [(owner.name, owner.feed) for owner in owners]


def feed_health(
    names: tuple[str, str], feeds: Iterable[tuple[tuple[str, ...], FeedHealth]], labels: list[str]
) -> list[Metric]:
    """The outage flag and the age of the last refresh (``names``: their metric names) of
    ``feeds`` (label values, feed): the gauges the HTTP service and a bare KafkaPurgatory both
    export, each under its own names."""
    from prometheus_client.core import GaugeMetricFamily

    unavailable = GaugeMetricFamily(names[0], "1 while the change feed cannot reach Kafka.", labels=labels)
    age = GaugeMetricFamily(
        names[1],
        "Seconds since the change feed last refreshed its facts from Kafka (grows in an outage).",
        labels=labels,
    )
    now = time.monotonic()
    # One sample per label set: feeds sharing labels (two KafkaPurgatory named alike) report
    # the worse of them — an outage of either, the older refresh.
    worst: dict[tuple[str, ...], tuple[float, float]] = {}
    for values, feed in feeds:
        down, seconds = 1.0 if feed.unavailable else 0.0, now - feed.stats.last_success
        before = worst.get(values, (0.0, 0.0))
        worst[values] = (max(before[0], down), max(before[1], seconds))
    for values, (down, seconds) in worst.items():
        unavailable.add_metric(list(values), down)
        age.add_metric(list(values), seconds)
    return [unavailable, age]


class KafkaCollector:
    """Answers per status and the feed health of every live KafkaPurgatory, read at scrape time.

    ``answers`` and ``feeds`` default to the process-wide ones (tests pass their own).
    """

    def __init__(
        self,
        answers: AnswerCounts | None = None,
        feeds: Callable[[], list[tuple[str, FeedHealth]]] = live_feeds,
    ) -> None:
        self._answers = answers if answers is not None else ANSWERS
        self._feeds = feeds

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        answers = CounterMetricFamily(
            ANSWERS_METRIC,
            "Answers of the Kafka operations, by operation type and status (NONE: success).",
            labels=["operation", "status"],
        )
        for (operation, status), count in sorted(self._answers.snapshot().items()):
            answers.add_metric([operation, status], count)
        yield answers
        feeds = [((name,), feed) for name, feed in self._feeds()]
        yield from feed_health(FEED_HEALTH_METRICS, feeds, ["name"])


_registered: dict[int, KafkaCollector] = {}


def register_kafka_metrics(registry: CollectorRegistry | None = None) -> KafkaCollector:
    """Register the collector with ``registry`` (the default one) once; idempotent per registry."""
    from prometheus_client import REGISTRY

    target = REGISTRY if registry is None else registry
    collector = _registered.get(id(target))
    if collector is None:
        collector = KafkaCollector()
        target.register(collector)  # any object with collect() (a Collector by its protocol)
        _registered[id(target)] = collector
    return collector
