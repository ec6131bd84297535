"""The example service end to end: a real HTTP client, uvicorn on 127.0.0.1, the real local Kafka."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from purgatory.adapters.kafka import ProducerRecord, TopicPartitionKey
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import Gateway, create_app
from purgatory.adapters.service.app._requests import MAX_FETCH_BYTES, MAX_PRODUCE_BODY_BYTES
from purgatory.adapters.service.server._server import BackgroundServer

from purgatory import Outcome
from purgatory.settings import JournalSettings, Settings
from tests.kafka.kafka_fixtures import RecordAppender, TopicFactory

from .conftest import WAIT_S, Service, until

pytestmark = pytest.mark.kafka

PREFIX = "kafka_server_DelayedOperationPurgatory_"


def _records_url(topic: str, partition: int = 0) -> str:
    return f"/topics/{topic}/partitions/{partition}/records"


async def _produce(client: httpx.AsyncClient, topic: str, *values: str, partition: int = 0) -> httpx.Response:
    body = {"records": [{"value": v, "key": f"k{i}", "partition": partition} for i, v in enumerate(values)]}
    return await client.post(f"/topics/{topic}/records", json=body)


def _fetch_pending(gateway: Gateway) -> int:
    return gateway.long_poll_waiters


# -- long poll ------------------------------------------------------------------------------------


async def test_long_poll_is_answered_by_a_record_produced_while_it_waits(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        started = time.monotonic()
        poll = asyncio.create_task(
            client.get(_records_url(topic), params={"offset": 0, "max_wait_ms": 15_000})
        )
        await until(
            lambda: _fetch_pending(service.gateway) >= 1, "the long poll to wait in the fetch purgatory"
        )
        assert not poll.done(), "no record yet: the poll must still be waiting"
        produced = await _produce(client, topic, "hello")
        assert produced.status_code == 200, produced.text
        response = await asyncio.wait_for(poll, WAIT_S)
        elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["outcome"] == "COMPLETED"
    assert [(r["offset"], r["key"], r["value"]) for r in body["records"]] == [(0, "k0", "hello")]
    assert body["next_offset"] == 1 and body["error_code"] == "NONE"
    assert elapsed < 15.0, "answered by the record, not by max_wait_ms"


async def test_long_poll_expires_after_max_wait_ms_with_no_records(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        started = time.monotonic()
        response = await client.get(_records_url(topic), params={"offset": 0, "max_wait_ms": 300})
        elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["outcome"] == "EXPIRED" and body["records"] == [] and body["next_offset"] == 0
    assert elapsed >= 0.3, f"held for max_wait_ms, answered after {elapsed:.3f} s"


async def test_fetch_without_offset_waits_for_new_records_only(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        assert (await _produce(client, topic, "old-1", "old-2")).status_code == 200
        poll = asyncio.create_task(client.get(_records_url(topic), params={"max_wait_ms": 15_000}))
        await until(lambda: _fetch_pending(service.gateway) >= 1, "the poll to wait")
        assert (await _produce(client, topic, "new")).status_code == 200
        body = (await asyncio.wait_for(poll, WAIT_S)).json()
    assert body["fetch_offset"] == 2, "started at the high watermark"
    assert [r["value"] for r in body["records"]] == ["new"]


async def test_records_already_there_are_returned_at_once(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        assert (await _produce(client, topic, "a", "b", "c")).status_code == 200
        started = time.monotonic()
        response = await client.get(
            _records_url(topic), params={"offset": 1, "min_records": 2, "max_wait_ms": 20_000}
        )
        elapsed = time.monotonic() - started
    body = response.json()
    assert body["outcome"] == "COMPLETED"
    assert [r["value"] for r in body["records"]] == ["b", "c"]
    assert elapsed < 10.0, "completed on facts, not after max_wait_ms"


@pytest.mark.parametrize("max_wait_ms", [0, 1])
async def test_max_wait_ms_0_answers_at_once_with_the_records_already_there(
    service: Service, kafka_topic_factory: TopicFactory, max_wait_ms: int
) -> None:
    """Kafka's fetch with max_wait_ms 0 answers with what is there now. The poll expires before
    the change feed first reported its (fresh) partition: it once answered no records at all."""
    topic = kafka_topic_factory(1)
    records = [ProducerRecord(topic, v.encode(), partition=0) for v in ("a", "b", "c")]
    # Appended past the service (no request watched the partition): not in the feed's facts.
    await asyncio.to_thread(RecordAppender(service.gateway.settings.kafka).produce, records)
    assert service.gateway.feed.partition(TopicPartitionKey(topic, 0)) is None
    async with service.client() as client:
        response = await client.get(_records_url(topic), params={"offset": 1, "max_wait_ms": max_wait_ms})
        at_end = await client.get(_records_url(topic), params={"offset": 3, "max_wait_ms": max_wait_ms})
    assert response.status_code == 200, response.text
    assert [r["value"] for r in response.json()["records"]] == ["b", "c"], response.json()
    assert at_end.status_code == 200 and at_end.json()["records"] == [], at_end.text


async def test_min_bytes_holds_the_poll_until_enough_bytes_arrived(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    gateway = service.gateway
    async with service.client() as client:
        # Each record is key "k0" (2 bytes) + 10 bytes of value = 12 bytes; ask for 20.
        poll = asyncio.create_task(
            client.get(_records_url(topic), params={"offset": 0, "min_bytes": 20, "max_wait_ms": 15_000})
        )
        await until(lambda: _fetch_pending(gateway) >= 1, "the poll to wait")
        assert (await _produce(client, topic, "x" * 10)).status_code == 200
        seen = gateway.feed.partition
        await until(
            lambda: (f := seen(key)) is not None and f.high_watermark == 1, "the feed to see record 1"
        )
        # The feed checks changed keys right after publishing them, on its own thread; once its
        # next poll has begun, the check of record 1 has run.
        polls = gateway.feed.stats.polls
        await until(lambda: gateway.feed.stats.polls > polls, "the feed's next poll")
        assert not poll.done(), "12 bytes < min_bytes: still waiting"
        assert (await _produce(client, topic, "y" * 10)).status_code == 200
        body = (await asyncio.wait_for(poll, WAIT_S)).json()
    assert body["outcome"] == "COMPLETED"
    assert [r["value"] for r in body["records"]] == ["x" * 10, "y" * 10]


async def test_many_long_polls_on_one_partition_are_answered_by_one_record(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    polls = 50
    async with service.client() as client:
        before = service.gateway.fetch_purgatory.stats.as_dict()["completed"]
        reads_before = service.gateway.reader.kafka_reads
        tasks = [
            asyncio.create_task(client.get(_records_url(topic), params={"offset": 0, "max_wait_ms": 15_000}))
            for _ in range(polls)
        ]
        await until(lambda: _fetch_pending(service.gateway) >= polls, f"{polls} polls to wait")
        assert (await _produce(client, topic, "fan-out")).status_code == 200
        responses = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    assert all(r.json()["records"][0]["value"] == "fan-out" for r in responses)
    # Equal long polls share one operation (issue 30): one completed for the 50 answers.
    assert service.gateway.fetch_purgatory.stats.as_dict()["completed"] - before == 1
    assert len(responses) == polls and service.gateway.long_poll_waiters == 0
    assert service.gateway.reader.kafka_reads - reads_before == 1, "one Kafka read answered every poll"


# -- produce and wait ------------------------------------------------------------------------------


async def test_produce_answers_once_replicated_with_offsets_per_partition(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    body = {
        "records": [
            {"value": "p0", "partition": 0},
            {"value": "p1", "partition": 1},
            {"value": "p1b", "partition": 1},
        ]
    }
    async with service.client() as client:
        response = await client.post(f"/topics/{topic}/records", json=body, params=None)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["outcome"] == "COMPLETED"
    assert answer["offsets"] == {"0": 0, "1": 1}, "last offset appended per partition"
    assert answer["statuses"] == {"0": "NONE", "1": "NONE"}


# -- bad requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "status", "field"),
    [
        ("/topics/no-such-topic-svc/partitions/0/records", {}, 404, "topic"),
        ("{topic}/partitions/7/records", {}, 404, "partition"),
        ("{topic}/partitions/x/records", {}, 400, "partition"),
        ("/topics/bad%20name!/partitions/0/records", {}, 400, "topic"),
        ("{topic}/partitions/0/records", {"max_wait_ms": -1}, 400, "max_wait_ms"),
        ("{topic}/partitions/0/records", {"max_bytes": MAX_FETCH_BYTES * 64}, 400, "max_bytes"),
        ("{topic}/partitions/0/records", {"min_bytes": 10, "max_bytes": 5}, 400, "min_bytes"),
        ("{topic}/partitions/0/records", {"wait": 5}, 400, "wait"),
        ("{topic}/partitions/0/records", {"offset": 99, "max_wait_ms": 5000}, 416, "offset"),
    ],
)
async def test_bad_fetch_requests_get_a_4xx_json_error_naming_the_field(
    service: Service,
    kafka_topic_factory: TopicFactory,
    path: str,
    params: dict[str, int],
    status: int,
    field: str,
) -> None:
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        response = await client.get(path.replace("{topic}", f"/topics/{topic}"), params=params)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert error["field"] == field, error
    assert error["error"] and error["message"]
    assert service.gateway.fetch_purgatory.num_delayed() == 0, "nothing left waiting"


JSON = {"content-type": "application/json"}


def _json(document: object) -> bytes:
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("content", "headers", "status", "field"),
    [
        (b"{not json", JSON, 400, "body"),
        (_json({"records": []}), JSON, 400, "records"),
        (_json({"records": [{"value": 5}]}), JSON, 400, "records[0].value"),
        (_json({"records": [{"value": "a", "partition": 3}]}), JSON, 404, "records[0].partition"),
        (_json({"records": [{"value": "a"}], "timeout_ms": -5}), JSON, 400, "timeout_ms"),
        (b"value=a", {"content-type": "application/x-www-form-urlencoded"}, 415, "content-type"),
        (b"[" + b" " * (MAX_PRODUCE_BODY_BYTES + 1) + b"]", JSON, 413, "body"),
    ],
)
async def test_bad_produce_requests_get_a_4xx_json_error_naming_the_field(
    service: Service,
    kafka_topic_factory: TopicFactory,
    content: bytes,
    headers: dict[str, str],
    status: int,
    field: str,
) -> None:
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        response = await client.post(f"/topics/{topic}/records", content=content, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["field"] == field


async def test_produce_to_an_unknown_topic_is_a_404_and_appends_nothing(service: Service) -> None:
    async with service.client() as client:
        response = await client.post(
            "/topics/no-such-topic-svc-p/records", json={"records": [{"value": "a"}]}
        )
    assert response.status_code == 404
    assert response.json() == {
        "error": "UNKNOWN_TOPIC_OR_PARTITION",
        "field": "topic",
        "message": "topic 'no-such-topic-svc-p' does not exist",
        "value": "no-such-topic-svc-p",
    }


# -- metrics, health, shutdown ---------------------------------------------------------------------


def _sample(text: str, name: str, purgatory: str) -> float:
    prefix = f'{PREFIX}{name}{{delayedOperation="{purgatory}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert lines, f"{prefix!r} missing from /metrics"
    return float(lines[0].removeprefix(prefix))


async def test_metrics_export_kafka_purgatory_names_per_purgatory(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        before = (await client.get("/metrics")).text
        expired_before = _sample(before, "Expires_total", "fetch")
        poll = asyncio.create_task(
            client.get(_records_url(topic), params={"offset": 0, "max_wait_ms": 2_000})
        )
        await until(lambda: _fetch_pending(service.gateway) >= 1, "the poll to wait")
        during = await client.get("/metrics")
        assert during.headers["content-type"].startswith("text/plain")
        assert _sample(during.text, "NumDelayedOperations", "fetch") >= 1
        assert _sample(during.text, "PurgatorySize", "fetch") >= 1
        assert (await asyncio.wait_for(poll, WAIT_S)).json()["outcome"] == "EXPIRED"
        after = (await client.get("/metrics")).text
    assert _sample(after, "Expires_total", "fetch") == expired_before + 1
    service_metrics = {
        line.split(" ")[0] for line in after.splitlines() if line.startswith("purgatory_service_")
    }
    assert {
        'purgatory_service_fetch_reads_total{source="kafka"}',
        'purgatory_service_fetch_reads_total{source="shared"}',
        "purgatory_service_feed_polls_total",
        "purgatory_service_kafka_unavailable",
    } <= service_metrics
    assert "purgatory_service_kafka_unavailable 0.0" in after
    assert _sample(after, "NumDelayedOperations", "produce") == 0


async def test_healthz_reports_serving_and_each_purgatory(service: Service) -> None:
    async with service.client() as client:
        response = await client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert set(body["purgatories"]) == {"fetch", "produce", "replication"}


async def test_closing_the_gateway_answers_every_waiting_poll(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    """The lifespan shutdown: a drain finishes waiting operations (EXPIRED) instead of leaving them."""
    topic = kafka_topic_factory(1)
    from purgatory.adapters.service.app._requests import FetchParams

    gateway = Gateway(service.settings)
    gateway.start()
    try:
        waiting = [
            asyncio.create_task(gateway.fetch(topic, 0, FetchParams(offset=0, max_wait_ms=30_000)))
            for _ in range(5)
        ]
        await until(lambda: gateway.long_poll_waiters == 5, "5 polls to wait")
    finally:
        started = time.monotonic()
        gateway.close()
    ops = await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
    assert time.monotonic() - started < 10.0, "drained, not left to run out their 30 s"
    assert [op.outcome for op in ops] == [Outcome.EXPIRED] * 5
    with pytest.raises(Exception, match="shutting down"):
        await gateway.fetch(topic, 0, FetchParams(offset=0, max_wait_ms=10))


async def test_a_client_that_leaves_cancels_its_long_poll(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    """The awaiting handler is cancelled on disconnect, so the operation finishes as CANCELLED at once."""
    topic = kafka_topic_factory(1)
    purgatory = service.gateway.fetch_purgatory
    cancelled_before = purgatory.stats.as_dict()["cancelled"]
    async with service.client() as client:
        poll = asyncio.create_task(
            client.get(_records_url(topic), params={"offset": 0, "max_wait_ms": 30_000})
        )
        await until(lambda: _fetch_pending(service.gateway) >= 1, "the poll to wait")
        poll.cancel()  # httpx closes the connection of a cancelled request
        with pytest.raises(asyncio.CancelledError):
            await poll
    await until(
        lambda: purgatory.stats.as_dict()["cancelled"] == cancelled_before + 1, "the op to be cancelled"
    )
    assert purgatory.num_delayed() == 0, "taken out of the timer, not left for its 30 s"


def test_journal_records_each_request_lifecycle_when_enabled(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """With ``journal.enabled`` the service journals its operations (what `purgatory analyze` reads)."""
    topic = kafka_topic_factory(1)
    journal = JournalSettings(enabled=True, sinks=("file",), directory=str(tmp_path), flush_interval_ms=10)
    settings = Settings(kafka=kafka_settings, journal=journal)
    with BackgroundServer(create_app(settings)) as server:
        url = f"{server.url}{_records_url(topic)}"
        assert (
            httpx.get(url, params={"offset": 0, "max_wait_ms": 100}, timeout=WAIT_S).json()["outcome"]
            == "EXPIRED"
        )
        produced = httpx.post(
            f"{server.url}/topics/{topic}/records", json={"records": [{"value": "v"}]}, timeout=WAIT_S
        )
        assert produced.status_code == 200
    # Leaving the server ran the lifespan shutdown, which closes (flushes) the journal.
    events = [
        json.loads(line)
        for segment in sorted(tmp_path.glob("*.jsonl"))
        for line in segment.read_text().splitlines()
    ]
    seen = sorted((e["purgatory"], e["op_type"], e["event_type"]) for e in events)
    assert seen == [
        ("fetch", "DelayedFetch", "created"),
        ("fetch", "DelayedFetch", "expired"),
        ("produce", "DelayedProduce", "completed"),
        ("produce", "DelayedProduce", "created"),
    ]


async def test_reading_records_already_there_never_blocks_the_event_loop(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    """The read of a fetch completed at submission happens off the loop: other tasks keep running."""
    from purgatory.adapters.service.app._requests import FetchParams

    topic = kafka_topic_factory(1)
    async with service.client() as client:
        assert (await _produce(client, topic, *["v" * 100] * 20)).status_code == 200
    gateway = Gateway(service.settings)
    gateway.start()
    try:
        await gateway.partitions(topic)  # metadata cached: only the purgatory path is left
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        for offset in range(5):
            before = ticks
            op = await gateway.fetch(topic, 0, FetchParams(offset=offset, min_bytes=100, max_wait_ms=20_000))
            assert op.outcome is Outcome.COMPLETED and len(op.records[TopicPartitionKey(topic, 0)]) >= 1
            assert ticks > before, "the loop ran other tasks while the records were read"
        ticking.cancel()
    finally:
        gateway.close()


async def test_unknown_routes_and_methods_answer_in_the_same_json_shape(service: Service) -> None:
    async with service.client() as client:
        missing = await client.get("/no/such/route")
        wrong = await client.delete("/topics/t/records")
    assert missing.status_code == 404 and missing.json()["error"] == "NOT_FOUND"
    assert wrong.status_code == 405 and wrong.json()["error"] == "METHOD_NOT_ALLOWED"
    assert "POST" in wrong.headers["allow"]


async def test_stopping_the_server_ends_a_poll_still_open_after_the_grace_period(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    """Shutdown is bounded: after uvicorn's grace period the poll's request is cancelled and the
    lifespan shutdown drains the purgatory; its operation finishes exactly once either way."""
    topic = kafka_topic_factory(1)
    app = create_app(Settings(kafka=kafka_settings))
    server = BackgroundServer(app, graceful_shutdown_s=1).start()
    purgatory = app.state.gateway.fetch_purgatory
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
            poll = asyncio.create_task(
                client.get(_records_url(topic), params={"offset": 0, "max_wait_ms": 30_000})
            )
            await until(lambda: purgatory.num_delayed() == 1, "the poll to wait")
            started = time.monotonic()
            await asyncio.to_thread(server.stop)
            stopped_after = time.monotonic() - started
            try:
                answer: int | None = (await poll).status_code  # uvicorn answers a cancelled request 500
            except httpx.HTTPError:
                answer = None  # or the connection closed first
    finally:
        server.stop()
    assert stopped_after < 10.0, f"stopped after {stopped_after:.1f} s, not after the poll's 30 s"
    assert answer in (500, None), "no answer pretends the poll completed or expired"
    stats = purgatory.stats.as_dict()
    # Finished exactly once: cancelled with its request, or expired by the drain if that ran first.
    assert stats["completed"] == 0 and stats["cancelled"] + stats["expired"] == 1, stats
    assert purgatory.closed
