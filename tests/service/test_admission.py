"""Fan-out and admission (docs/design.md §8): O(1) waiters, per-key and per-process limits, the wait clamp."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from purgatory.adapters.kafka.ops._off_loop_fetch import OffLoopFetch
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.server._server import BackgroundServer
from purgatory.adapters.service.settings import AdmissionSettings

from purgatory.settings import Settings
from tests.kafka.kafka_fixtures import TopicFactory

from .conftest import WAIT_S, Service, until

pytestmark = pytest.mark.kafka

MAX_WAITERS = 3
MAX_PER_KEY = 2
CLAMP_MS = 300


@pytest.fixture(scope="module")
def small_service(kafka_settings: KafkaSettings) -> Iterator[Service]:
    admission = AdmissionSettings(
        max_waiters=MAX_WAITERS, max_waiters_per_key=MAX_PER_KEY, max_wait_ms=CLAMP_MS, retry_after_s=2
    )
    settings = Settings(kafka=kafka_settings, admission=admission)
    app = create_app(settings)
    with BackgroundServer(app) as server:
        yield Service(server.url, app, settings)


def _poll(
    client: httpx.AsyncClient, topic: str, partition: int, wait_ms: int = 60_000
) -> asyncio.Task[httpx.Response]:
    url = f"/topics/{topic}/partitions/{partition}/records"
    return asyncio.create_task(client.get(url, params={"offset": 0, "max_wait_ms": wait_ms}))


async def test_a_full_key_answers_429_with_retry_after_and_other_keys_still_admit(
    small_service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    gateway = small_service.gateway
    async with small_service.client() as client:
        waiting = [_poll(client, topic, 0, CLAMP_MS) for _ in range(MAX_PER_KEY)]
        await until(lambda: gateway.long_poll_waiters == MAX_PER_KEY, "two polls waiting on p0")
        refused = await client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0})
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "2"
        body = refused.json()
        assert body["error"] == "PURGATORY_FULL" and "max_pending_per_key=2" in body["message"]
        other = await client.get(
            f"/topics/{topic}/partitions/1/records", params={"offset": 0, "max_wait_ms": 50}
        )
        assert other.status_code == 200 and other.json()["outcome"] == "EXPIRED", "partition 1 still admits"
        answered = await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
    assert [r.json()["outcome"] for r in answered] == ["EXPIRED", "EXPIRED"], "admitted polls are answered"


async def test_the_process_limit_answers_429_and_admits_again_once_a_waiter_left(
    small_service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(3)
    gateway = small_service.gateway
    async with small_service.client() as client:
        waiting = [_poll(client, topic, p, CLAMP_MS) for p in range(MAX_WAITERS)]
        await until(lambda: gateway.long_poll_waiters == MAX_WAITERS, "three polls waiting")
        refused = await client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0})
        assert refused.status_code == 429, refused.text
        assert (
            "'service' is full" in refused.json()["message"] and "max_pending=3" in refused.json()["message"]
        )
        await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
        again = await client.get(
            f"/topics/{topic}/partitions/0/records", params={"offset": 0, "max_wait_ms": 10}
        )
    assert again.status_code == 200, "room again once the waiters were answered"


async def test_a_long_poll_longer_than_the_clamp_is_answered_at_the_clamp(
    small_service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    async with small_service.client(timeout_s=10.0) as client:  # 60 s asked: would time the client out
        response = await client.get(
            f"/topics/{topic}/partitions/0/records", params={"offset": 0, "max_wait_ms": 60_000}
        )
    assert response.status_code == 200 and response.json()["outcome"] == "EXPIRED"


async def test_adding_a_waiter_does_not_recheck_the_other_waiters_on_its_key(
    service: Service, kafka_topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registration is O(1) per waiter: N waiters on one partition cost O(N) completion attempts.

    The gateway used to call check_and_complete(key) for every new long poll — every waiter on the
    key re-checked each time, N²/2 attempts for N waiters (27.6 s to register 5,000).
    """
    topic = kafka_topic_factory(1)
    polls = 90  # under httpx's 100-connection pool: every poll holds its own connection
    attempts = 0
    original = OffLoopFetch.try_complete

    def counting(self: OffLoopFetch) -> bool:
        nonlocal attempts
        attempts += 1
        return original(self)

    monkeypatch.setattr(OffLoopFetch, "try_complete", counting)
    gateway = service.gateway
    async with service.client() as client:
        waiting = [_poll(client, topic, 0, 15_000) for _ in range(polls)]
        await until(lambda: gateway.long_poll_waiters >= polls, f"{polls} polls waiting")
        registering = attempts
        produced = await client.post(
            f"/topics/{topic}/records", json={"records": [{"value": "v", "partition": 0}]}
        )
        assert produced.status_code == 200
        answered = await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
    assert all(r.json()["outcome"] == "COMPLETED" for r in answered)
    # Two tries per submission, at most one more when the key's facts first appear.
    assert registering <= 3 * polls, (
        f"{registering} attempts to register {polls} waiters (quadratic: ~{polls**2 // 2})"
    )


def test_the_service_tunes_the_cyclic_gc_while_it_serves_and_restores_it(
    kafka_settings: KafkaSettings,
) -> None:
    import gc

    before = gc.get_threshold()
    settings = Settings(kafka=kafka_settings, admission=AdmissionSettings(gc_thresholds=(40_000, 15, 90)))
    with BackgroundServer(create_app(settings)):
        assert gc.get_threshold() == (40_000, 15, 90), (
            "held waiters are long-lived: young collections are rarer"
        )
    assert gc.get_threshold() == before, "the interpreter's thresholds are back once the service stopped"
