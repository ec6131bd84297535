"""The examples/ run against real Kafka: the FastAPI orders service and the aiokafka billing consumer."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

pytest.importorskip("fastapi")

from confluent_kafka import Consumer, TopicPartition
from fastapi.testclient import TestClient
from purgatory.adapters.kafka.settings import KafkaSettings

from examples.billing_consumer import consume
from examples.orders_service import create_app
from purgatory.settings import Settings

from .kafka_fixtures import WAIT_S

pytestmark = pytest.mark.kafka


def _names() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"orders-{suffix}", f"billing-{suffix}"


def test_orders_service_answers_when_replicated_and_when_billing_processed(
    kafka_settings: KafkaSettings, kafka_bootstrap: str
) -> None:
    topic, group = _names()
    app = create_app(topic, group, Settings(kafka=kafka_settings))
    with TestClient(app) as client:  # runs the lifespan: connect, create the topic
        placed = client.post("/orders", json={"item": "book", "quantity": 2})
        assert placed.status_code == 201, placed.text
        offset = placed.json()["offset"]

        early = client.get("/orders/wait", params={"offset": offset, "timeout_ms": 300})
        assert early.status_code == 504, "nobody processed the order yet"

        billed: list[dict[str, Any]] = []
        worker = threading.Thread(
            target=consume,
            args=(kafka_bootstrap, topic, group),
            kwargs={"process": billed.append, "max_records": 1},
        )
        worker.start()
        done = client.get("/orders/wait", params={"offset": offset, "timeout_ms": int(WAIT_S * 1000)})
        worker.join(WAIT_S)
        assert done.status_code == 200, done.text
        assert done.json() == {"offset": offset, "committed": offset + 1}
        assert billed == [{"item": "book", "quantity": 2}]

        refused = client.post("/orders", json={"item": "", "quantity": 0})
        assert refused.status_code == 422, "FastAPI validates the order"


def test_billing_consumer_commits_each_record_it_processed(
    kafka_settings: KafkaSettings, kafka_bootstrap: str
) -> None:
    topic, group = _names()
    with TestClient(create_app(topic, group, Settings(kafka=kafka_settings))) as client:
        for quantity in (1, 2, 3):
            assert client.post("/orders", json={"item": "pen", "quantity": quantity}).status_code == 201
    seen: list[dict[str, Any]] = []
    assert consume(kafka_bootstrap, topic, group, process=seen.append, max_records=3) == 3
    assert [order["quantity"] for order in seen] == [1, 2, 3]
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        (committed,) = reader.committed([TopicPartition(topic, 0)], timeout=WAIT_S)
    finally:
        reader.close()
    assert committed.offset == 3, "committed past the last processed record"
