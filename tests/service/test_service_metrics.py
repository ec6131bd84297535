"""The service's own metrics without Kafka: answers by status and error code, change feed health."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from purgatory.adapters.kafka.facts._gathered import GatheredRecords, Holding
from purgatory.adapters.service.app._metrics import Answers, CountAnswers, ServiceCollector, error_code_of
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route


def _exposition(collector: ServiceCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_error_code_is_read_from_the_json_body_of_error_answers_only() -> None:
    assert error_code_of(200, b'{"error": "NOT_ENOUGH_REPLICAS"}') == "NONE", "below 400: no error"
    assert error_code_of(503, b'{"error": "NOT_ENOUGH_REPLICAS", "field": null}') == "NOT_ENOUGH_REPLICAS"
    assert error_code_of(500, b"Internal Server Error") == "UNKNOWN", "not JSON"
    assert error_code_of(400, b'{"error": "lower case <script>"}') == "UNKNOWN", "no label set to grow"
    assert error_code_of(400, b"[1, 2]") == "UNKNOWN"


def test_answers_are_counted_per_status_and_error_code_through_the_asgi_app() -> None:
    async def ok(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def refused(request: Any) -> JSONResponse:
        return JSONResponse({"error": "TOPIC_AUTHORIZATION_FAILED", "field": "topic"}, status_code=403)

    answers = Answers()
    app = Starlette(routes=[Route("/ok", ok), Route("/refused", refused)])

    async def exercise() -> None:
        transport = httpx.ASGITransport(app=CountAnswers(app, answers=answers))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for _ in range(3):
                assert (await client.get("/ok")).status_code == 200
            assert (await client.get("/refused")).status_code == 403
            assert (await client.get("/nowhere")).status_code == 404  # Starlette's own, plain text

    asyncio.run(exercise())
    assert answers.snapshot() == {
        (200, "NONE"): 3,
        (403, "TOPIC_AUTHORIZATION_FAILED"): 1,
        (404, "UNKNOWN"): 1,
    }


def test_http11_answers_written_below_the_app_are_counted() -> None:
    answers = Answers()
    answers.count_http11(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    body = b'{"error":"OFFSET_OUT_OF_RANGE","field":"offset","message":"..."}'
    answers.count_http11(
        b"HTTP/1.1 416 Range Not Satisfiable\r\ncontent-type: application/json\r\n\r\n" + body
    )
    answers.count(200, None, 5)  # a batch of HTTP/2 answers
    assert answers.snapshot() == {(200, "NONE"): 6, (416, "OFFSET_OUT_OF_RANGE"): 1}


def _gateway(*, unavailable: str | None, last_success: float) -> Any:
    gathered = GatheredRecords(100)
    assert gathered.take(Holding(), [], own_bytes=6), "6 bytes held toward min_bytes"
    assert not gathered.take(Holding(), [], own_bytes=200), "one fetch answered early"
    stats = SimpleNamespace(polls=7, failures=2, last_success=last_success)
    feed = SimpleNamespace(stats=stats, unavailable=unavailable, watched_keys=lambda: frozenset())
    return SimpleNamespace(
        reader=SimpleNamespace(
            kafka_reads=1,
            shared_hits=2,
            cached_bytes=3,
            gathered=gathered,
        ),
        feed=feed,
        view=SimpleNamespace(requests_sent=3),
        task_free_fetches=4,
        long_poll_waiters=5,
    )


def test_feed_health_reports_the_outage_and_the_age_of_the_last_refresh() -> None:
    answers = Answers()
    answers.count(503, b'{"error": "KAFKA_UNAVAILABLE"}')
    gateway = _gateway(unavailable="all brokers down", last_success=time.monotonic() - 30.0)
    text = _exposition(ServiceCollector(lambda: gateway, answers))
    assert "purgatory_service_kafka_unavailable 1.0" in text, "the outage flag is up"
    (age_line,) = [
        line
        for line in text.splitlines()
        if line.startswith("purgatory_service_feed_last_success_age_seconds ")
    ]
    assert 30.0 <= float(age_line.split()[1]) < 60.0, "the age counts from the last successful refresh"
    assert 'purgatory_service_answers_total{error="KAFKA_UNAVAILABLE",status="503"} 1.0' in text
    assert "purgatory_service_record_cache_bytes 3.0" in text, "the record cache's bytes, a gauge"
    assert "purgatory_service_gathered_bytes 6.0" in text, "bytes held toward min_bytes, a gauge"
    assert "purgatory_service_gathered_peak_bytes 6.0" in text
    assert "purgatory_service_gathered_early_answers_total 1.0" in text


def test_answers_are_exported_before_the_gateway_starts() -> None:
    answers = Answers()
    answers.count(503, b'{"error": "UNAVAILABLE"}')
    text = _exposition(ServiceCollector(lambda: None, answers))
    assert 'purgatory_service_answers_total{error="UNAVAILABLE",status="503"} 1.0' in text
    assert "purgatory_service_feed" not in text, "no gateway: nothing about the feed"
