"""The service's own metrics, next to the purgatories' (read at scrape time: no hot-path cost).

``purgatory_service_fetch_reads_total{source}`` — record reads answered by Kafka or shared from a
span (``SharedReadReader``); ``purgatory_service_record_cache_bytes`` — the bytes those spans
hold; ``purgatory_service_feed_polls_total`` and
``purgatory_service_feed_failures_total`` — the change feed's batched polls and failed ones;
``purgatory_service_kafka_unavailable`` — 1 while the last poll could not reach Kafka;
``purgatory_service_kafka_requests_total`` — requests the cluster view sent (what scale-out
divides between instances); ``purgatory_service_watched_partitions`` — partitions each poll asks about;
``purgatory_service_task_free_long_polls_total`` — long polls the protocol-level path served;
``purgatory_service_answers_total{status, error}`` — answers sent, by HTTP status and the JSON
error code (``NONE`` below 400); ``purgatory_service_feed_last_success_age_seconds`` — time since
the change feed last refreshed its facts from Kafka (grows through an outage).

The two feed-health gauges are built by the Kafka adapter's :func:`feed_health` (a bare
``KafkaPurgatory`` exports the same pair as ``purgatory_kafka_...``); the service keeps its names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...kafka import TopicPartitionKey
from ...kafka._metrics import feed_health
from ._gateway import Gateway

__all__ = ["Answers", "CountAnswers", "ServiceCollector", "error_code_of"]

# What an error label may hold: the service's codes are Kafka-style upper-case names; anything
# else (a body that is not ours) is counted as UNKNOWN, so no client can grow the label set.
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
NO_ERROR = "NONE"  # the error label of answers below 400 (Kafka's ErrorCode.NONE)
UNKNOWN_ERROR = "UNKNOWN"  # an error answer whose body names no code of ours


def error_code_of(status: int, body: bytes | memoryview | None) -> str:
    """The ``error`` label of an answer: NONE below 400, else the code its JSON body names."""
    if status < 400:
        return NO_ERROR
    try:
        document: Any = json.loads(bytes(body or b""))
    except ValueError:
        return UNKNOWN_ERROR
    code = document.get("error") if isinstance(document, dict) else None
    return code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else UNKNOWN_ERROR


class Answers:
    """The service's answers by HTTP status and error code (``purgatory_service_answers_total``).

    Counted where an answer is handed to the connection: :class:`CountAnswers` for the ASGI
    app's routes, the protocol-level long-poll paths (HTTP/1.1 and HTTP/2) for the answers they
    write themselves. Concurrency contract: the event loop's thread only (no lock).
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[tuple[int, str], int] = {}

    def count(self, status: int, body: bytes | memoryview | None = None, n: int = 1) -> None:
        """Count ``n`` answers of ``status``; ``body`` (its JSON) names the error code from 400 up."""
        key = (status, error_code_of(status, body))
        self._counts[key] = self._counts.get(key, 0) + n

    def count_http11(self, data: bytes, n: int = 1) -> None:
        """Count ``n`` HTTP/1.1 answers written as ``data`` (status line, headers, body)."""
        status = int(data[9:12])  # b"HTTP/1.1 200 ..."
        body = data[data.find(b"\r\n\r\n") + 4 :] if status >= 400 else None
        self.count(status, body, n)

    def snapshot(self) -> dict[tuple[int, str], int]:
        return dict(self._counts)


class CountAnswers:
    """ASGI middleware (outermost): counts every answer the app sends in :class:`Answers`.

    Answers below 400 are counted at their start; error answers once their body (one message:
    the service's JSON errors are small) says which code they carry."""

    def __init__(self, app: ASGIApp, *, answers: Answers) -> None:
        self.app = app
        self.answers = answers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answers = self.answers
        error_status = 0

        async def counting_send(message: Message) -> None:
            nonlocal error_status
            kind = message["type"]
            if kind == "http.response.start":
                status = int(message["status"])
                if status < 400:
                    answers.count(status)
                else:
                    error_status = status
            elif kind == "http.response.body" and error_status:
                answers.count(error_status, message.get("body", b""))
                error_status = 0
            await send(message)

        await self.app(scope, receive, counting_send)


class ServiceCollector(Collector):
    """Reads the answers and the current gateway (None before startup and after shutdown: then
    only the answers are exported)."""

    def __init__(self, gateway: Callable[[], Gateway | None], answers: Answers | None = None) -> None:
        self._gateway = gateway
        self._answers = answers if answers is not None else Answers()

    def collect(self) -> Iterator[Metric]:
        answers = CounterMetricFamily(
            "purgatory_service_answers",
            "Answers sent, by HTTP status and error code (NONE below 400).",
            labels=["status", "error"],
        )
        for (status, code), count in sorted(self._answers.snapshot().items()):
            answers.add_metric([str(status), code], count)
        yield answers
        gateway = self._gateway()
        if gateway is None:
            return
        reads = CounterMetricFamily(
            "purgatory_service_fetch_reads", "Record reads of long polls, by source.", labels=["source"]
        )
        reads.add_metric(["kafka"], gateway.reader.kafka_reads)
        reads.add_metric(["shared"], gateway.reader.shared_hits)
        cache = GaugeMetricFamily(
            "purgatory_service_record_cache_bytes",
            "Bytes of records the shared record cache holds (bounded: docs/operations/limits.md).",
        )
        cache.add_metric([], gateway.reader.cached_bytes)
        yield cache
        gathered = gateway.reader.gathered
        if gathered is not None:
            held = GaugeMetricFamily(
                "purgatory_service_gathered_bytes",
                "Records long polls waiting for min_bytes hold (bound: service.gathered_budget_bytes).",
            )
            held.add_metric([], gathered.held_bytes)
            yield held
            peak = GaugeMetricFamily(
                "purgatory_service_gathered_peak_bytes", "The most purgatory_service_gathered_bytes has been."
            )
            peak.add_metric([], gathered.peak_bytes)
            yield peak
            early = CounterMetricFamily(
                "purgatory_service_gathered_early_answers",
                "Long polls answered short of min_bytes: their next read would pass the gathered budget.",
            )
            early.add_metric([], gathered.refusals)
            yield early
        stats = gateway.feed.stats
        polls = CounterMetricFamily("purgatory_service_feed_polls", "Change feed polls (one batch each).")
        polls.add_metric([], stats.polls)
        failures = CounterMetricFamily("purgatory_service_feed_failures", "Change feed polls that failed.")
        failures.add_metric([], stats.failures)
        unavailable, age = feed_health(
            ("purgatory_service_kafka_unavailable", "purgatory_service_feed_last_success_age_seconds"),
            [((), gateway.feed)],
            [],
        )
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
        waiters = GaugeMetricFamily(
            "purgatory_service_long_poll_waiters",
            "Long polls waiting: requests, where the fetch purgatory's PurgatorySize and "
            "NumDelayedOperations count operations (one per group of equal long polls).",
        )
        waiters.add_metric([], gateway.long_poll_waiters)
        yield from (reads, polls, failures, unavailable, age, requests, watched, task_free, waiters)
