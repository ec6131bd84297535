"""Request-reply while a broker dies: every request sent around the kill is answered exactly once.

Three local brokers (``kafka_cluster3``; node 1 is the controller, so the fault hits node 2). The
request and reply topics are replicated on all three and *led by node 2*; the test answers a first
batch, SIGKILLs node 2, and sends a second batch at once. The idempotent producers retry to the
new leaders, the responder's group and the requester's tail re-find them, and each request
finishes once (a reply repeated by the responder's at-least-once retry is dropped as a
duplicate). Bounded: every wait has a deadline; node 2 is started again at the end.
"""

from __future__ import annotations

import uuid

from purgatory.adapters.kafka import KafkaPurgatory, LocalKafkaCluster, Request, Responder
from purgatory.adapters.kafka.settings import KafkaSettings

from .conftest import WAIT_S
from .kafka_fixtures import FOLLOWERS, LEADER, create_topic

VICTIM = FOLLOWERS[0]  # node 2: not the controller
FIRST, SECOND = 10, 20
FAILOVER_WAIT_S = 60.0  # fencing (broker.session.timeout.ms 3 s), elections, group moves, retries


def _echo(request: Request) -> bytes:
    return b"re:" + (request.value or b"")


def test_requests_are_answered_once_across_a_killed_leader(kafka_cluster3: LocalKafkaCluster) -> None:
    bootstrap = kafka_cluster3.bootstrap_servers
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    led_by_victim = [VICTIM, LEADER, FOLLOWERS[1]]
    config = {"min.insync.replicas": "2"}
    topic = create_topic(
        bootstrap, f"ask-{uuid.uuid4().hex[:8]}", replica_assignment=[led_by_victim], config=config
    )
    reply_topic = create_topic(
        bootstrap,
        f"answers-{uuid.uuid4().hex[:8]}",
        replica_assignment=[led_by_victim, led_by_victim],
        config=config,
    )
    echo = Responder(topic, _echo, group=f"echo-{uuid.uuid4().hex[:8]}", session_timeout_ms=6000)
    kp = KafkaPurgatory.connect(settings, name="failover")
    kp.replies(reply_topic)
    try:
        echo.start(settings)
        assert echo.assigned.wait(WAIT_S), "the responder joined its group"
        before = [kp.request(topic, f"b{i}".encode(), timeout_ms=30_000) for i in range(FIRST)]
        for op in before:
            assert op.wait(WAIT_S), "answered while every broker is up"
        kafka_cluster3.kill_broker(VICTIM)  # SIGKILL the leader of both topics
        after = [kp.request(topic, f"a{i}".encode(), timeout_ms=50_000) for i in range(SECOND)]
        for op in after:
            assert op.wait(FAILOVER_WAIT_S), f"request {op.correlation_id} answered after the failover"
        values = [op.result().value for op in (*before, *after)]
        assert values == [f"re:b{i}".encode() for i in range(FIRST)] + [
            f"re:a{i}".encode() for i in range(SECOND)
        ]
        stats = kp.replies().stats
        assert stats.answered == FIRST + SECOND and stats.expired == 0 and stats.failed == 0
        assert stats.replies == stats.answered + stats.duplicates, "every other reply read was a copy"
    finally:
        echo.stop()
        kp.close()
        kafka_cluster3.start_broker(VICTIM)
