"""ClusterView against a real Kafka: batched facts and typed errors."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from purgatory.adapters.kafka import (
    ClusterView,
    GroupPartitionKey,
    KafkaUnavailableError,
    TopicKey,
    TopicPartitionKey,
    UnknownTopicError,
)
from purgatory.adapters.kafka.local import free_port
from purgatory.adapters.kafka.settings import KafkaSettings

from .kafka_fixtures import TopicFactory

pytestmark = pytest.mark.kafka

DESCRIBE_TIMEOUT_S = 30.0  # a fresh cluster may still be loading the group's coordinator


def _produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(topic, f"v{i}".encode(), partition=partition)
    assert producer.flush(10) == 0, "every record acknowledged"


def test_high_watermarks_and_log_start_offsets_for_many_partitions_in_one_request_each(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(8)
    bootstrap = kafka_settings.bootstrap_servers or ""
    _produce(bootstrap, topic, {p: p for p in range(8)})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_records([TopicPartition(topic, 5, 2)]).values():
        f.result(timeout=10)
    view = ClusterView(kafka_settings)
    keys = [TopicPartitionKey(topic, p) for p in range(8)]

    before = view.requests_sent
    assert view.high_watermarks(keys) == {k: k.partition for k in keys}
    assert view.requests_sent - before == 1, "8 partitions' high watermarks cost one ListOffsets request"
    starts = view.log_start_offsets(keys)
    assert starts[TopicPartitionKey(topic, 5)] == 2
    assert all(v == 0 for k, v in starts.items() if k.partition != 5)


def test_facts_report_leader_isr_min_insync_and_topic_leaders(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2, config={"min.insync.replicas": "1"})
    view = ClusterView(kafka_settings)
    before = view.requests_sent
    facts = view.facts([TopicPartitionKey(topic, 0), TopicPartitionKey(topic, 1)], [TopicKey(topic)])
    # DescribeTopics + ListOffsets(latest) + ListOffsets(earliest) + DescribeConfigs (first time only)
    assert view.requests_sent - before == 4
    part = facts.partitions[TopicPartitionKey(topic, 1)]
    assert part.leader >= 0 and part.isr == (part.leader,) and part.min_insync_replicas == 1
    assert part.high_watermark == 0 and part.log_start_offset == 0 and part.error is None
    assert facts.topics[TopicKey(topic)].all_partitions_have_leaders
    before = view.requests_sent
    view.facts([TopicPartitionKey(topic, 0)])
    assert view.requests_sent - before == 3, "min.insync.replicas is cached between polls"


def test_committed_offsets_of_a_group(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    bootstrap = kafka_settings.bootstrap_servers or ""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False}
    )
    try:
        consumer.commit(offsets=[TopicPartition(topic, 1, 7)], asynchronous=False)
    finally:
        consumer.close()
    view = ClusterView(kafka_settings)
    keys = [GroupPartitionKey(f"g-{topic}", topic, 0), GroupPartitionKey(f"g-{topic}", topic, 1)]
    assert view.committed_offsets(keys) == {keys[0]: None, keys[1]: 7}


def test_committed_offsets_are_read_without_joining_the_group_by_one_reader_per_watched_group(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    bootstrap = kafka_settings.bootstrap_servers or ""
    groups = [f"a-{topic}", f"b-{topic}"]
    view = ClusterView(kafka_settings)
    try:
        facts = view.facts(groups=[GroupPartitionKey(g, topic, 0) for g in groups])
        assert all(f.error is None and f.committed is None for f in facts.groups.values())
        assert view.group_readers == frozenset(groups)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        described = admin.describe_consumer_groups([groups[0]], request_timeout=DESCRIBE_TIMEOUT_S)
        group = described[groups[0]].result(DESCRIBE_TIMEOUT_S + 5)
        assert group.members == [], "the offset reader never joins the group"
        view.facts(groups=[GroupPartitionKey(groups[0], topic, 0)])
        assert view.group_readers == frozenset(groups[:1]), "an unwatched group's reader is closed"
    finally:
        view.close()
    assert view.group_readers == frozenset()


def test_topic_existence(kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory) -> None:
    topic = kafka_topic_factory(1)
    assert ClusterView(kafka_settings).topic_exists([topic, "no-such-topic-x"]) == {
        topic: True,
        "no-such-topic-x": False,
    }


def test_unknown_topic_and_unknown_partition_raise_unknown_topic_error(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    view = ClusterView(kafka_settings)
    with pytest.raises(UnknownTopicError, match="no-such-topic-y"):
        view.high_watermarks([TopicPartitionKey("no-such-topic-y", 0)])
    with pytest.raises(UnknownTopicError, match="no-such-topic-y"):
        view.topics([TopicKey("no-such-topic-y")])
    facts = view.facts([TopicPartitionKey(topic, 3), TopicPartitionKey(topic, 0)])
    error = facts.partitions[TopicPartitionKey(topic, 3)].error
    assert error is not None and error.kind == "unknown_topic" and "has 1 partitions" in error.message
    assert facts.partitions[TopicPartitionKey(topic, 0)].error is None, "one bad key does not spoil the batch"


def test_unreachable_cluster_raises_kafka_unavailable_error_within_the_request_timeout() -> None:
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1000)
    view = ClusterView(settings)
    with pytest.raises(KafkaUnavailableError):
        view.facts([TopicPartitionKey("any", 0)])
