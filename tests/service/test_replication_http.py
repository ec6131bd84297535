"""Produce-and-wait over HTTP on three brokers (RF 3, min.insync.replicas 2), followers hung or stopped.

The HTTP answer must say whether the records are safely replicated: 200 when every in-sync
replica has them, 504 REQUEST_TIMED_OUT when followers hang past the timeout, 503
NOT_ENOUGH_REPLICAS when the ISR shrank below min.insync.replicas. A 3-broker cluster of this
module (the shared ``kafka_cluster3``: node 1 controller and leader; faults hit followers 2 and 3),
restored after each test.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from purgatory.adapters.kafka import LocalKafkaCluster, TopicPartitionKey
from purgatory.adapters.service import create_app
from purgatory.adapters.service._server import BackgroundServer

from purgatory.settings import KafkaSettings, Settings
from tests.kafka.kafka_fixtures import (
    FOLLOWERS,
    WAIT_S,
    StrandedRecord,
    replicated_topic,
    restore_followers,
    stranding_topic,
    wait_isr,
    wait_until,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def topic3(kafka_cluster3: LocalKafkaCluster) -> Iterator[tuple[str, str, KafkaSettings]]:
    """(service URL, RF-3 topic led by node 1, settings); every broker running again afterwards."""
    kafka, key = replicated_topic(kafka_cluster3, "http-rep")
    try:
        # Named explicitly: PURGATORY_KAFKA_BOOTSTRAP (the user's cluster) beats settings in the
        # service's bootstrap order, and this test stops brokers of its own cluster.
        app = create_app(Settings(kafka=kafka), bootstrap_servers=kafka.bootstrap_servers)
        with BackgroundServer(app) as server:
            yield server.url, key.topic, kafka
    finally:
        restore_followers(kafka_cluster3, kafka, key)


def _post(url: str, topic: str, timeout_ms: int, records: int = 1) -> httpx.Response:
    body = {"records": [{"value": "r", "partition": 0}] * records, "timeout_ms": timeout_ms}
    return httpx.post(f"{url}/topics/{topic}/records", json=body, timeout=30.0)


def test_produce_is_200_when_replicated_and_504_while_followers_hang(
    kafka_cluster3: LocalKafkaCluster, topic3: tuple[str, str, KafkaSettings]
) -> None:
    url, topic, _ = topic3
    ok = _post(url, topic, 15_000)  # also caches the topic's metadata while every broker answers
    assert ok.status_code == 200, ok.text
    assert ok.json()["statuses"] == {"0": "NONE"}
    for node in FOLLOWERS:
        kafka_cluster3.pause_broker(node)  # hung, still in the ISR for replica.lag.time.max.ms
    hung = _post(url, topic, 1_000)
    assert hung.status_code == 504, hung.text
    body = hung.json()
    assert body["error"] == "REQUEST_TIMED_OUT" and body["statuses"] == {"0": "REQUEST_TIMED_OUT"}
    assert body["offsets"] == {"0": 1}, "the leader appended it: the answer says where"


def test_produce_is_503_not_enough_replicas_when_the_isr_is_below_min_insync(
    kafka_cluster3: LocalKafkaCluster, topic3: tuple[str, str, KafkaSettings]
) -> None:
    url, topic, kafka = topic3
    assert _post(url, topic, 15_000).status_code == 200
    for node in FOLLOWERS:
        kafka_cluster3.stop_broker(node)
    wait_isr(kafka, TopicPartitionKey(topic, 0), 1)
    response = _post(url, topic, 15_000)
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "NOT_ENOUGH_REPLICAS"
    assert response.json()["statuses"] == {"0": "NOT_ENOUGH_REPLICAS"}


def test_a_produce_whose_record_a_leader_change_discarded_is_503_not_leader_never_200(
    kafka_cluster3: LocalKafkaCluster,
) -> None:
    """The acks=1 hole over HTTP (see test_replication's leader-change test and
    :class:`StrandedRecord` for the mechanics): leader 2 appends the record while both followers
    are frozen; leader 2 dies, node 3 leads without it, later records take its offset. The
    waiting request must not say 200."""
    cluster = kafka_cluster3
    kafka, key = stranding_topic(cluster, "http-lost")
    topic = key.topic
    app = create_app(Settings(kafka=kafka), bootstrap_servers=kafka.bootstrap_servers)  # not the user's
    stranded: StrandedRecord | None = None
    try:
        with BackgroundServer(app) as server, ThreadPoolExecutor(1) as pool:
            assert _post(server.url, topic, 15_000).status_code == 200
            produce = app.state.gateway.produce_purgatory
            stranded = StrandedRecord(cluster, kafka, key)
            stranded.freeze_followers()
            try:
                filler = stranded.append_filler()
                lost = pool.submit(_post, server.url, topic, 60_000)
                wait_until(lambda: produce.num_delayed() == 1, "the leader appended the record")
                stranded.assert_stranded()
            finally:
                stranded.kill_leader_and_resume()
            # More records, once a follower leads: they take the lost record's offset (three: the
            # new leader may lack the filler too), and its high watermark passes it.
            after: list[httpx.Response] = []

            def a_follower_takes_produces() -> bool:
                after.append(_post(server.url, topic, 5_000, records=3))
                return after[-1].status_code == 200

            wait_until(a_follower_takes_produces, "a follower takes produces", 60)
            assert after[-1].json()["offsets"]["0"] > filler, "the new leader reused the lost record's offset"
            answer = lost.result(timeout=WAIT_S)
        assert answer.json().get("offsets") == {"0": filler + 1}, (
            f"appended right after the filler: {answer.text}"
        )
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "NOT_LEADER_OR_FOLLOWER"
        assert answer.json()["statuses"] == {"0": "NOT_LEADER_OR_FOLLOWER"}
    finally:
        if stranded is not None:
            stranded.close()
        else:
            wait_isr(kafka, key, 3)
