"""Faults on real Kafka: a broker killed and a broker paused while operations wait on it, and
the journal's Kafka sink losing its broker. The scenarios (``purgatory.tools.reliability.kafka_faults``)
run on a one-broker cluster of their own — faults must not disturb the session cluster the other
tests share — stopped by PID at the end of the module. Every wait inside is bounded.

The broker faults include DelayedConsumerCommit: the cluster view reads committed offsets with a
non-joining consumer's OffsetFetch, because the admin ListConsumerGroupOffsets request aborted
the whole process when it timed out on a frozen connection (librdkafka #4605). The pause test
pins that the process survives with group operations waiting.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

KINDS = ("DelayedReplication", "DelayedFetch", "DelayedTopicReady", "DelayedConsumerCommit")


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from purgatory.adapters.kafka import LocalKafkaCluster

    cluster = LocalKafkaCluster(brokers=1, work_dir=Path(tmp_path_factory.mktemp("fault-kafka")))
    cluster.start()
    try:
        yield cluster
    finally:
        pid = cluster.node(1).pid
        cluster.stop()
        assert not cluster.node(1).is_running(), f"broker pid {pid} outlived the test"


def test_broker_killed_while_operations_wait(fault_cluster: object) -> None:
    """SIGKILL while produce, fetch, topic-ready and consumer-commit operations wait on the broker: they all
    expire with KafkaUnavailableError (REQUEST_TIMED_OUT per partition), raising response callbacks
    included; local keys are served throughout; after a restart the feed and clients recover."""
    from purgatory.tools.reliability.kafka_faults import WAITING_PER_KIND, broker_fault

    result = broker_fault(fault_cluster, "kill")
    assert result.survived, result.problems
    assert result.affected == 4 * WAITING_PER_KIND
    assert set(result.outcomes) == {f"{kind}: expired" for kind in KINDS}


def test_broker_paused_while_operations_wait(fault_cluster: object) -> None:
    """SIGSTOP: the broker's sockets stay open but nothing answers — the worst case for a client,
    and the one that aborted the process through ListConsumerGroupOffsets (librdkafka #4605).
    The cluster view's request timeout turns it into an outage; everything, consumer commits
    included, then ends as for a dead broker, and SIGCONT brings the feed back."""
    from purgatory.tools.reliability.kafka_faults import WAITING_PER_KIND, broker_fault

    result = broker_fault(fault_cluster, "pause")
    assert result.survived, result.problems
    assert result.affected == 4 * WAITING_PER_KIND
    assert set(result.outcomes) == {f"{kind}: expired" for kind in KINDS}


def test_journal_kafka_sink_unreachable_loses_nothing_and_recovers(fault_cluster: object) -> None:
    """The journal's broker is killed mid-run: the purgatory keeps its pace, events queue in the
    producer, and after the restart the topic holds every operation's two events, once each."""
    from purgatory.tools.reliability.kafka_faults import JOURNAL_OPS, journal_sink_unreachable

    result = journal_sink_unreachable(fault_cluster)
    assert result.survived, result.problems
    assert result.outcomes == {"completed": 2 * JOURNAL_OPS, "journal events on the topic": 4 * JOURNAL_OPS}
