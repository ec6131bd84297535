"""Produce-and-wait over HTTP on three brokers (RF 3, min.insync.replicas 2), followers hung or stopped.

The HTTP answer must say whether the records are safely replicated: 200 when every in-sync
replica has them, 504 REQUEST_TIMED_OUT when followers hang past the timeout, 503
NOT_ENOUGH_REPLICAS when the ISR shrank below min.insync.replicas. A 3-broker cluster of this
module's own (node 1 controller and leader; faults hit followers 2 and 3), restored after each test.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from purgatory.adapters.kafka import ClusterView, LocalKafkaCluster, TopicPartitionKey
from purgatory.adapters.service import create_app
from purgatory.adapters.service._server import BackgroundServer

from purgatory.settings import KafkaSettings, Settings
from tests.integration.kafka_fixtures import create_topic

pytestmark = pytest.mark.kafka

LEADER, FOLLOWERS = 1, (2, 3)
ISR_WAIT_S = 60.0  # a restarted follower catches up and rejoins the ISR (replica.lag.time.max.ms 4 s)


@pytest.fixture(scope="module")
def cluster3() -> Iterator[LocalKafkaCluster]:
    cluster = LocalKafkaCluster(brokers=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _isr_size(settings: KafkaSettings, key: TopicPartitionKey) -> int:
    view = ClusterView(settings)
    try:
        return len(view.facts([key]).partitions[key].isr)
    finally:
        view.close()


def _wait_isr(settings: KafkaSettings, key: TopicPartitionKey, size: int) -> None:
    deadline = time.monotonic() + ISR_WAIT_S
    while _isr_size(settings, key) != size:  # ISR changes have no client-side event
        assert time.monotonic() < deadline, f"ISR of {key.label} never reached {size} replicas"
        time.sleep(0.1)


@pytest.fixture
def topic3(cluster3: LocalKafkaCluster) -> Iterator[tuple[str, str, KafkaSettings]]:
    """(service URL, RF-3 topic led by node 1, settings); every broker running again afterwards."""
    # A short admin timeout: the feed's requests may land on a hung broker while a test runs.
    kafka = KafkaSettings(bootstrap_servers=cluster3.bootstrap_servers, request_timeout_ms=2000)
    topic = create_topic(
        cluster3.bootstrap_servers,
        f"http-rep-{uuid.uuid4().hex[:8]}",
        replica_assignment=[[LEADER, *FOLLOWERS]],
        config={"min.insync.replicas": "2"},
    )
    key = TopicPartitionKey(topic, 0)
    _wait_isr(kafka, key, 3)
    try:
        with BackgroundServer(create_app(Settings(kafka=kafka))) as server:
            yield server.url, topic, kafka
    finally:
        for node in FOLLOWERS:
            cluster3.resume_broker(node)
            if not cluster3.node(node).is_running():
                cluster3.start_broker(node)
        _wait_isr(kafka, key, 3)


def _post(url: str, topic: str, timeout_ms: int) -> httpx.Response:
    body = {"records": [{"value": "r", "partition": 0}], "timeout_ms": timeout_ms}
    return httpx.post(f"{url}/topics/{topic}/records", json=body, timeout=30.0)


def test_produce_is_200_when_replicated_and_504_while_followers_hang(
    cluster3: LocalKafkaCluster, topic3: tuple[str, str, KafkaSettings]
) -> None:
    url, topic, _ = topic3
    ok = _post(url, topic, 15_000)  # also caches the topic's metadata while every broker answers
    assert ok.status_code == 200, ok.text
    assert ok.json()["statuses"] == {"0": "NONE"}
    for node in FOLLOWERS:
        cluster3.pause_broker(node)  # hung, still in the ISR for replica.lag.time.max.ms
    hung = _post(url, topic, 1_000)
    assert hung.status_code == 504, hung.text
    body = hung.json()
    assert body["error"] == "REQUEST_TIMED_OUT" and body["statuses"] == {"0": "REQUEST_TIMED_OUT"}
    assert body["offsets"] == {"0": 1}, "the leader appended it: the answer says where"


def test_produce_is_503_not_enough_replicas_when_the_isr_is_below_min_insync(
    cluster3: LocalKafkaCluster, topic3: tuple[str, str, KafkaSettings]
) -> None:
    url, topic, kafka = topic3
    assert _post(url, topic, 15_000).status_code == 200
    for node in FOLLOWERS:
        cluster3.stop_broker(node)
    _wait_isr(kafka, TopicPartitionKey(topic, 0), 1)
    response = _post(url, topic, 15_000)
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "NOT_ENOUGH_REPLICAS"
    assert response.json()["statuses"] == {"0": "NOT_ENOUGH_REPLICAS"}
