"""Request-reply over Kafka on a real cluster: requests are delayed operations on their correlation id.

Each test uses fresh request and reply topics and its own responder groups, so tests do not see
each other's records. Responders run in threads here (a crash test runs one in a process).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest
from purgatory.adapters.kafka import (
    KafkaPurgatory,
    Request,
    RequestTimeoutError,
    Responder,
    ResponderError,
    responder,
)

from purgatory import Outcome
from purgatory.settings import KafkaSettings

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import TopicFactory

REPLY_PARTITIONS = 2


@pytest.fixture
def requester(kafka_settings: KafkaSettings) -> Iterator[KafkaPurgatory]:
    kp = KafkaPurgatory.connect(kafka_settings, name="rr")
    kp.replies(f"replies-{uuid.uuid4().hex[:8]}", partitions=REPLY_PARTITIONS)
    try:
        yield kp
    finally:
        kp.close()


def _group() -> str:
    return f"responder-{uuid.uuid4().hex[:8]}"


def _started(r: Responder, settings: KafkaSettings) -> Responder:
    r.start(settings)
    assert r.assigned.wait(WAIT_S), f"responder group {r.group} was never assigned {r.topic}"
    return r


def test_request_gets_the_reply_before_its_deadline(
    requester: KafkaPurgatory, kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(prefix="prices")

    @responder(topic, group=_group())
    def price(request: Request) -> bytes:
        return b"price of " + (request.value or b"")

    with _started(price, kafka_settings):

        async def ask() -> bytes | None:
            result = await requester.aio.request(topic, b"AAPL", timeout_ms=10_000)
            assert result.complete and len(result.replies) == 1
            assert result.reply.responder == price.group, "the reply names the group that answered"
            return result.value

        assert asyncio.run(ask()) == b"price of AAPL"
    stats = requester.replies().stats
    assert (stats.answered, stats.expired, stats.late) == (1, 0, 0)
    assert requester.replies().pending() == 0, "an answered request is no longer pending"
