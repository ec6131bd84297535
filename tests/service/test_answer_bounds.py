"""Every HTTP answer within its stated bound while a broker is SIGSTOPped or SIGKILLed.

Stated bounds (the gateway's module docstring): a produce is answered within
``append_timeout_ms + timeout_ms``, a long poll within ``max_wait_ms + request_timeout_ms +
READ_TIMEOUT_S`` (metadata or the start offset, then one read of what arrived) — plus
scheduling slack. Requests
arrive together, more of them than asyncio's default executor has threads on this machine, so
a blocking Kafka call queued behind others would show. 1 broker (its own cluster: the session
broker is shared) and 3 brokers (the partition's leader, node 2, which is not the controller, so
the partition moves on when it dies; and node 1, controller and follower). Each case restores
the broker it hit.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
from purgatory.adapters.kafka import (
    KafkaStartError,
    LocalKafkaCluster,
    ProducerRecord,
    RecordReader,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.clients._clients import READ_TIMEOUT_S
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.server._server import BackgroundServer

from purgatory.settings import Settings
from tests.kafka.kafka_fixtures import RecordAppender, create_topic, wait_isr

pytestmark = pytest.mark.kafka

REQUEST_TIMEOUT_MS = 2000
APPEND_TIMEOUT_MS = 3000
PRODUCE_TIMEOUT_MS = 3000
MAX_WAIT_MS = 1000
SLACK_S = 1.5  # event-loop and thread scheduling on a shared 2-core machine
CONCURRENT = 16  # of each kind: asyncio's default executor has min(32, cores + 4) = 6 threads here
PRODUCE_BOUND_S = (APPEND_TIMEOUT_MS + PRODUCE_TIMEOUT_MS) / 1000 + SLACK_S
FETCH_BOUND_S = (MAX_WAIT_MS + REQUEST_TIMEOUT_MS) / 1000 + READ_TIMEOUT_S + SLACK_S


async def _burst(url: str, topic: str) -> list[tuple[str, int, float, str]]:
    """CONCURRENT produces and CONCURRENT long polls at once: (kind, status, seconds, body)."""
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:

        async def one(kind: str) -> tuple[str, int, float, str]:
            started = time.monotonic()
            if kind == "produce":
                body = {"records": [{"value": "v", "partition": 0}], "timeout_ms": PRODUCE_TIMEOUT_MS}
                response = await client.post(f"/topics/{topic}/records", json=body)
            else:
                # Half the polls start at the high watermark (an offset lookup), half at 0 (a
                # read of what is there, min_bytes past it so they wait).
                params = {"max_wait_ms": MAX_WAIT_MS}
                if kind == "fetch-from-0":
                    params |= {"offset": 0, "min_bytes": 1 << 20}
                response = await client.get(f"/topics/{topic}/partitions/0/records", params=params)
            return kind, response.status_code, time.monotonic() - started, response.text[:200]

        kinds = (
            ["produce"] * CONCURRENT + ["fetch"] * (CONCURRENT // 2) + ["fetch-from-0"] * (CONCURRENT // 2)
        )
        return await asyncio.gather(*(one(k) for k in kinds))


def _check_bounds(answers: list[tuple[str, int, float, str]]) -> None:
    kinds = ("produce", "fetch", "fetch-from-0")
    slowest = {kind: max(seconds for k, _, seconds, _ in answers if k == kind) for kind in kinds}
    print("slowest answers: " + ", ".join(f"{k} {s:.2f} s" for k, s in slowest.items()))
    for kind, status, seconds, text in answers:
        bound = PRODUCE_BOUND_S if kind == "produce" else FETCH_BOUND_S
        assert seconds <= bound, f"{kind} answered after {seconds:.1f} s > {bound:.1f} s ({status} {text})"
        assert status in (200, 503, 504), f"{kind}: {status} {text}"


def _exercise(cluster: LocalKafkaCluster, node: int, topic: str, fault: str, feed_mode: str) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=cluster.bootstrap_servers,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        append_timeout_ms=APPEND_TIMEOUT_MS,
        feed_mode=feed_mode,
    )
    # The cluster named explicitly: the service's bootstrap order puts PURGATORY_KAFKA_BOOTSTRAP
    # (the user's cluster, when exported) above settings, and the faults hit this one.
    app = create_app(Settings(kafka=kafka), bootstrap_servers=cluster.bootstrap_servers)
    with BackgroundServer(app) as server:
        warm = httpx.post(
            f"{server.url}/topics/{topic}/records",
            json={"records": [{"value": "w", "partition": 0}]},
            timeout=30,
        )
        assert warm.status_code == 200, warm.text  # metadata cached, producer connected
        if fault == "SIGSTOP":
            cluster.pause_broker(node)
        else:
            cluster.kill_broker(node)
        try:
            answers = asyncio.run(_burst(server.url, topic))
        finally:
            if fault == "SIGSTOP":
                cluster.resume_broker(node)
                _ready_again(cluster, node)
            else:
                cluster.start_broker(node)
    _check_bounds(answers)


# The resumed node serves admin calls again within seconds here; once, deep in a full CI run,
# it served no metadata request for 90 s after SIGCONT (a fresh admin client's list_topics
# failed each time while its log showed it unfenced and leading). This is cleanup — the bounds
# are checked afterwards — so such a node is restarted rather than failing the case unchecked.
RESUMED_READY_S = 45.0


def _ready_again(cluster: LocalKafkaCluster, node: int) -> None:
    """Wait until the cluster serves admin calls after SIGCONT; restart ``node`` if it does not."""
    try:
        cluster.wait_ready(timeout_s=RESUMED_READY_S)
    except KafkaStartError as exc:
        print(f"node {node} did not serve again after SIGCONT, restarted: {str(exc)[:200]}")
        cluster.kill_broker(node)
        cluster.start_broker(node)
        cluster.wait_ready()


# Both change feeds: push (the tail's fetch long poll) must notice a stopped broker no later
# than the poll does. In push mode the 8 long polls from offset 0 were answered after 10-22 s
# (bound 6.5 s): each read the partition behind the previous one's 2 s stall (RecordReader).
FEED_MODES = pytest.mark.parametrize("feed_mode", ["poll", "push"])


@FEED_MODES
@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
def test_every_answer_within_its_bound_when_the_only_broker_is_hit(
    kafka_cluster1: LocalKafkaCluster, fault: str, feed_mode: str
) -> None:
    topic = create_topic(kafka_cluster1.bootstrap_servers, f"bound1-{uuid.uuid4().hex[:8]}")
    _exercise(kafka_cluster1, 1, topic, fault, feed_mode)


def test_a_read_behind_a_stalled_read_of_its_partition_answers_at_once(
    kafka_cluster1: LocalKafkaCluster,
) -> None:
    """A stopped broker stalls one read for its timeout; the reads queued behind it must not each wait too."""
    settings = KafkaSettings(bootstrap_servers=kafka_cluster1.bootstrap_servers)
    topic = create_topic(kafka_cluster1.bootstrap_servers, f"stall-{uuid.uuid4().hex[:8]}")
    key = TopicPartitionKey(topic, 0)
    producer = RecordAppender(settings)
    reader = RecordReader(settings)
    try:
        producer.produce([ProducerRecord(topic, b"v", None, 0)], 30.0)
        assert [r.value for r in reader.read(key, 0, 1, max_bytes=1 << 20)] == [b"v"]
        reader.close()  # the next read connects afresh: nothing fetched before is buffered
        kafka_cluster1.pause_broker(1)
        try:
            stalled = reader.read(key, 0, 1, max_bytes=1 << 20, timeout_s=1.0)
            assert stalled == [] and reader.stalled_reads == 1, "the stopped broker delivered nothing"
            reads = reader.reads
            assert reader.read(key, 0, 1, max_bytes=1 << 20, timeout_s=1.0) == []
            assert reader.reads == reads and reader.skipped_reads == 1, "the second read did not wait"
        finally:
            kafka_cluster1.resume_broker(1)
            kafka_cluster1.wait_ready()
        # Once the stalled read's window has passed (a time window: nothing to await but the
        # clock), a read goes to Kafka again, and a complete one clears the mark.
        time.sleep(max(0.0, reader._stalled[key] - time.monotonic()))
        assert [r.value for r in reader.read(key, 0, 1, max_bytes=1 << 20, timeout_s=30.0)] == [b"v"]
        assert reader.skipped_reads == 1 and key not in reader._stalled
    finally:
        reader.close()
        producer.close()


@FEED_MODES
@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
@pytest.mark.parametrize("node", [2, 1], ids=["leader", "controller-follower"])
def test_every_answer_within_its_bound_when_a_broker_of_three_is_hit(
    kafka_cluster3: LocalKafkaCluster, node: int, fault: str, feed_mode: str
) -> None:
    topic = create_topic(
        kafka_cluster3.bootstrap_servers,
        f"bound3-{uuid.uuid4().hex[:8]}",
        replica_assignment=[[2, 3, 1]],
        config={"min.insync.replicas": "2"},
    )
    settings = KafkaSettings(bootstrap_servers=kafka_cluster3.bootstrap_servers, request_timeout_ms=2000)
    key = TopicPartitionKey(topic, 0)
    wait_isr(settings, key, 3)
    try:
        _exercise(kafka_cluster3, node, topic, fault, feed_mode)
    finally:
        wait_isr(settings, key, 3)
