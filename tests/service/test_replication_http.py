"""Produce-and-wait over HTTP on three brokers (RF 3, min.insync.replicas 2), followers hung or
stopped, the leader killed.

The HTTP answer must say whether the records are safely replicated (acks=all): 200 when every
in-sync replica has them; 504 REQUEST_TIMED_OUT when followers hang or the ISR stays below
min.insync.replicas past the timeout (the producer retries NOT_ENOUGH_REPLICAS meanwhile, as a
plain producer does); and across a leader change the record answered 200 is in the log at its
offset, once. A 3-broker cluster of this module (the shared ``kafka_cluster3``: node 1 controller
and leader; faults hit followers 2 and 3), restored after each test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from purgatory.adapters.kafka import LocalKafkaCluster, TopicPartitionKey
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.server._server import BackgroundServer

from purgatory.settings import Settings
from tests.kafka.kafka_fixtures import (
    FOLLOWERS,
    RecordAppender,
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
    assert ok.json()["records"] == [{"partition": 0, "offset": 0, "status": "NONE"}]
    for node in FOLLOWERS:
        kafka_cluster3.pause_broker(node)  # hung, still in the ISR for replica.lag.time.max.ms
    hung = _post(url, topic, 1_000)
    assert hung.status_code == 504, hung.text
    body = hung.json()
    assert body["error"] == "REQUEST_TIMED_OUT" and body["statuses"] == {"0": "REQUEST_TIMED_OUT"}
    assert body["records"] == [{"partition": 0, "offset": None, "status": "REQUEST_TIMED_OUT"}]
    assert "may still be written" in body["message"], "not known: never said lost, never said done"


def test_produce_below_min_insync_times_out_then_a_waiting_one_completes_when_followers_return(
    kafka_cluster3: LocalKafkaCluster, topic3: tuple[str, str, KafkaSettings]
) -> None:
    url, topic, kafka = topic3
    assert _post(url, topic, 15_000).status_code == 200
    for node in FOLLOWERS:
        kafka_cluster3.stop_broker(node)
    wait_isr(kafka, TopicPartitionKey(topic, 0), 1)
    short = _post(url, topic, 2_000)
    assert short.status_code == 504, short.text  # NOT_ENOUGH_REPLICAS is retried until the timeout
    assert short.json()["records"][0]["offset"] is None
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_post, url, topic, 120_000)
        wait_until(lambda: not waiting.done() and _pending_produces(url) == 1, "the produce waits")
        for node in FOLLOWERS:
            kafka_cluster3.start_broker(node)
        answer = waiting.result(timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["statuses"] == {"0": "NONE"}


def _pending_produces(url: str) -> int:
    body = httpx.get(f"{url}/healthz", timeout=10.0).json()
    return int(body["purgatories"]["produce"]["NumDelayedOperations"])


def test_a_produce_waiting_across_a_leader_crash_is_200_with_its_record_at_its_offset_once(
    kafka_cluster3: LocalKafkaCluster,
) -> None:
    """The acks=1 hole, closed by acks=all: leader 2 holds the record while both followers are
    frozen (not acknowledged: no follower has it), then dies; node 3 leads without it. The
    idempotent producer resends it there, so the waiting request is answered 200 — and the
    record is at the offset the answer names, exactly once."""
    cluster = kafka_cluster3
    kafka, key = stranding_topic(cluster, "http-lost")
    topic = key.topic
    app = create_app(Settings(kafka=kafka), bootstrap_servers=kafka.bootstrap_servers)  # not the user's
    stranded: StrandedRecord | None = None
    value = f"crash-{uuid.uuid4().hex[:8]}"
    try:
        with BackgroundServer(app) as server, ThreadPoolExecutor(1) as pool:
            assert _post(server.url, topic, 15_000).status_code == 200
            produce = app.state.gateway.produce_purgatory
            stranded = StrandedRecord(cluster, kafka, key)
            stranded.freeze_followers()
            try:
                body = {"records": [{"value": value, "partition": 0}], "timeout_ms": 90_000}
                waiting = pool.submit(
                    httpx.post, f"{server.url}/topics/{topic}/records", json=body, timeout=120.0
                )
                wait_until(lambda: produce.num_delayed() == 1, "the record waits in the leader's purgatory")
            finally:
                stranded.kill_leader_and_resume()
            answer = waiting.result(timeout=120)
        assert answer.status_code == 200, answer.text
        offset = answer.json()["records"][0]["offset"]
        wait_isr(kafka, key, 2)
        log = RecordAppender.read_all(kafka, key)
        where = [o for o, v in log if v == value.encode()]
        assert where == [offset], f"acknowledged at {offset}; the log has it at {where}"
    finally:
        if stranded is not None:
            stranded.close()
        else:
            wait_isr(kafka, key, 3)
