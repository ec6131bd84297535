"""An unreachable cluster: ops expire with a clear error, other keys are served, the feed reconnects."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from purgatory.adapters.kafka import (
    DelayedReplication,
    ErrorCode,
    KafkaPurgatory,
    KafkaUnavailableError,
    LocalKafkaCluster,
    ProducerRecord,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import DelayedOperation, Outcome

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import create_topic

pytestmark = pytest.mark.kafka

LOCAL_KEY_BUDGET_S = 0.5  # a key unrelated to Kafka must be served at once, outage or not


class _Flag(DelayedOperation):
    """A plain operation completed by a flag: stands for the purgatory's other (non-Kafka) keys."""

    def __init__(self) -> None:
        super().__init__(60_000)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> None:
        pass


def test_outage_expires_ops_with_clear_error_serves_other_keys_and_feed_reconnects(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(brokers=1, work_dir=tmp_path / "kafka")
    cluster.start()
    try:
        settings = KafkaSettings(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=1000)
        topic = create_topic(cluster.bootstrap_servers, "outage", partitions=1)
        key = TopicPartitionKey(topic, 0)
        with KafkaPurgatory.connect(settings, name="outage") as kp:
            first = kp.produce([ProducerRecord(topic, b"before", partition=0)], delay_ms=10_000)
            assert first.wait(WAIT_S) and first.statuses == {key: ErrorCode.NONE}

            cluster.stop_broker(1)
            # Waits for an offset the (dead) cluster will not reach before the op's timeout.
            pending = kp.submit(
                DelayedReplication(kp.feed, {key: first.appended[key] + 5}, delay_ms=2500), validate=False
            )
            wait_until(lambda: kp.feed.unavailable is not None, "the feed noticed the outage")

            local = _Flag()
            assert not kp.purgatory.try_complete_else_watch(local, ["local-key"])
            local.ready = True
            started = time.monotonic()
            assert kp.purgatory.check_and_complete("local-key") == 1
            assert time.monotonic() - started < LOCAL_KEY_BUDGET_S, (
                "the dead cluster does not hold other keys up"
            )
            assert local.outcome is Outcome.COMPLETED

            assert pending.wait(WAIT_S)
            assert pending.outcome is Outcome.EXPIRED
            assert pending.statuses == {key: ErrorCode.REQUEST_TIMED_OUT}
            assert isinstance(pending.error, KafkaUnavailableError)
            assert "unreachable" in str(pending.error), f"a clear error, got {pending.error}"
            assert kp.feed.stats.failures > 0 and kp.feed.is_alive()

            # Something must stay watched for the feed to keep probing (it polls watched keys only).
            watcher = kp.submit(
                DelayedReplication(kp.feed, {key: 1_000_000}, delay_ms=60_000), validate=False
            )
            cluster.start_broker(1)
            wait_until(lambda: kp.feed.unavailable is None, "the feed reconnected", 60.0)
            again = kp.produce([ProducerRecord(topic, b"after", partition=0)], delay_ms=10_000)
            assert again.wait(WAIT_S)
            assert again.outcome is Outcome.COMPLETED and again.statuses == {key: ErrorCode.NONE}
            assert not watcher.is_completed(), "the far-away offset is still awaited (drained on close)"
    finally:
        cluster.stop()
