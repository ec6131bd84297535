"""Kafka adapters: a local Apache Kafka, a batched cluster view, a change feed, and Kafka-backed operations.

Quick start (a service)::

    from purgatory.adapters.kafka import KafkaPurgatory, ProducerRecord, TopicPartitionKey

    with KafkaPurgatory.connect(bootstrap_servers="127.0.0.1:9092") as kp:
        produce = kp.produce([ProducerRecord("orders", b"hello", partition=0)])
        produce.wait(30)                      # replicated to every in-sync replica
        fetch = kp.fetch({TopicPartitionKey("orders", 0): 0}, max_wait_ms=500)
        fetch.wait(5)                         # fetch.records[TopicPartitionKey("orders", 0)]

Local cluster: ``with LocalKafkaCluster(brokers=3) as cluster: cluster.bootstrap_servers``, or
``provide_cluster(settings)`` for the provider order of docs/design.md §5.
"""

from ._append import Appended, FencedAppender
from ._calls import KafkaCalls
from ._clients import FetchedRecord, ProducerRecord, RecordProducer, RecordReader
from ._config import client_config, redacted
from ._errors import (
    InvalidOffsetError,
    KafkaAdapterError,
    KafkaLauncherError,
    KafkaStartError,
    KafkaUnavailableError,
    UnknownGroupError,
    UnknownTopicError,
)
from ._facts import ClusterFacts, ErrorFact, FactSource, GroupFacts, PartitionFacts, TopicFacts
from ._feed import ChangeFeed, FeedStats
from ._keys import GroupPartitionKey, KafkaKey, TopicKey, TopicPartitionKey
from ._moved import Moved, MovedReason
from ._operations import (
    DelayedConsumerCommit,
    DelayedDeleteRecords,
    DelayedFetch,
    DelayedProduce,
    DelayedTopicReady,
    ErrorCode,
    KafkaOperation,
)
from ._ownership import (
    Member,
    Owner,
    OwnershipListener,
    OwnershipStats,
    OwnersSnapshot,
    OwnerStatus,
    PartitionOwnership,
    describe_owners,
)
from ._ownership_guard import OwnedOperation, OwnershipGuard, WatchedKeys
from ._provider import BOOTSTRAP_ENV, KafkaClusterHandle, docker_available, provide_cluster
from ._redirect import Redirect, moved_answer, redirect_for
from ._service import KafkaPurgatory
from ._view import ClusterView
from .local import DEFAULT_KAFKA_VERSION, LocalKafkaCluster, resolve_kafka

__all__ = [
    "BOOTSTRAP_ENV",
    "DEFAULT_KAFKA_VERSION",
    "Appended",
    "ChangeFeed",
    "ClusterFacts",
    "ClusterView",
    "DelayedConsumerCommit",
    "DelayedDeleteRecords",
    "DelayedFetch",
    "DelayedProduce",
    "DelayedTopicReady",
    "ErrorCode",
    "ErrorFact",
    "FactSource",
    "FeedStats",
    "FencedAppender",
    "FetchedRecord",
    "GroupFacts",
    "GroupPartitionKey",
    "InvalidOffsetError",
    "KafkaAdapterError",
    "KafkaCalls",
    "KafkaClusterHandle",
    "KafkaKey",
    "KafkaLauncherError",
    "KafkaOperation",
    "KafkaPurgatory",
    "KafkaStartError",
    "KafkaUnavailableError",
    "LocalKafkaCluster",
    "Member",
    "Moved",
    "MovedReason",
    "OwnedOperation",
    "Owner",
    "OwnerStatus",
    "OwnersSnapshot",
    "OwnershipGuard",
    "OwnershipListener",
    "OwnershipStats",
    "PartitionFacts",
    "PartitionOwnership",
    "ProducerRecord",
    "RecordProducer",
    "RecordReader",
    "Redirect",
    "TopicFacts",
    "TopicKey",
    "TopicPartitionKey",
    "UnknownGroupError",
    "UnknownTopicError",
    "WatchedKeys",
    "client_config",
    "describe_owners",
    "docker_available",
    "moved_answer",
    "provide_cluster",
    "redacted",
    "redirect_for",
    "resolve_kafka",
]
