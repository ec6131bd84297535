"""Kafka adapters: a local Apache Kafka, a batched cluster view, a change feed, and Kafka-backed operations.

Quick start (a service; settings from ``PURGATORY_*`` / ``PURGATORY_CONFIG_FILE``)::

    from purgatory.adapters.kafka import KafkaPurgatory, ProducerRecord, TopicPartitionKey

    async with KafkaPurgatory.connect() as kp:
        produced = await kp.produce([ProducerRecord("orders", b"hello", partition=0)])
        produced.succeeded                    # replicated to every in-sync replica
        fetched = await kp.fetch({TopicPartitionKey("orders", 0): 0}, max_wait_ms=500)
        fetched.records[TopicPartitionKey("orders", 0)]

From threads, ``with KafkaPurgatory.connect() as kp:`` returns submitted operations
(``kp.produce(...).wait(30)``, then ``op.result()``).

Request-reply: ``await kp.request("prices", b"AAPL", timeout_ms=500)`` answers with the reply of
a ``@responder("prices", group="pricer")`` handler (docs/design.md §9).

Local cluster: ``with LocalKafkaCluster(brokers=3) as cluster: cluster.bootstrap_servers``, or
``provide_cluster(settings)`` for the provider order of docs/design.md §5.
"""

from .clients._admin import create_topic, delete_records
from .clients._append import Appended
from .clients._calls import KafkaCalls
from .clients._clients import (
    DIGEST_BYTES,
    FetchedRecord,
    ProducerRecord,
    RecordIdentity,
    RecordReader,
)
from .clients._config import check_client_config, client_config, redacted
from .clients._errors import (
    InvalidOffsetError,
    InvalidTopicError,
    KafkaAdapterError,
    KafkaConfigError,
    KafkaLauncherError,
    KafkaStartError,
    KafkaUnavailableError,
    NodeNotRunningError,
    NoLocalClusterError,
    RecordTooLargeError,
    UnknownGroupError,
    UnknownNodeError,
    UnknownTopicError,
)
from .clients._provider import (
    BOOTSTRAP_ENV,
    KafkaClusterHandle,
    configured_bootstrap,
    docker_available,
    provide_cluster,
)
from .clients._sender import RecordSender
from .faces._service import PURGATORY_NAMES, AsyncKafkaPurgatory, KafkaPurgatory
from .facts._facts import ClusterFacts, ErrorFact, FactSource, GroupFacts, PartitionFacts, TopicFacts
from .facts._feed import ChangeFeed, FeedStats
from .facts._keys import (
    LEGAL_TOPIC_RULE,
    GroupPartitionKey,
    KafkaKey,
    TopicKey,
    TopicPartitionKey,
    is_legal_topic,
)
from .facts._record_cache import SharedReadReader

# The tail's fetch.wait.max.ms: public so a bench's bare consumer can fetch as the tail does.
from .facts._tail import FETCH_WAIT_MS as TAIL_FETCH_WAIT_MS
from .facts._view import ClusterView
from .local import DEFAULT_KAFKA_VERSION, LocalKafkaCluster, resolve_kafka
from .ops._fetch import DelayedFetch, PartitionRead
from .ops._metadata_waits import DelayedConsumerCommit, DelayedDeleteRecords, DelayedTopicReady
from .ops._moved import Moved, MovedReason
from .ops._operations import KafkaOperation
from .ops._produce import DelayedProduce, ProduceRequestKey
from .ops._replication import DelayedReplication
from .ops._results import (
    CommitResult,
    DeleteRecordsResult,
    ErrorCode,
    FetchResult,
    ProduceResult,
    ReplicationResult,
    TopicReadyResult,
)
from .ownership._owner_proof import OwnerProof
from .ownership._owners import Member, Owner, OwnersSnapshot, OwnerStatus, describe_owners
from .ownership._ownership import OwnershipListener, OwnershipStats, PartitionOwnership
from .ownership._ownership_guard import OwnedOperation, OwnershipGuard, WatchedKeys
from .reply._correlation import (
    CORRELATION_ID,
    DEADLINE_MS,
    ERROR,
    REPLY_FROM,
    REPLY_PARTITION,
    REPLY_TOPIC,
    CorrelationKey,
    Reply,
    ReplyAddress,
    encode_partition,
    header,
    headers_of,
)
from .reply._reply_router import LateReply, ReplyRouter, ReplyRouterStats
from .reply._request import DelayedRequest, RequestResult, RequestTimeoutError, ResponderError
from .reply._responder import Request, Responder, ResponderStats, request_of, responder

__all__ = [
    "BOOTSTRAP_ENV",
    "CORRELATION_ID",
    "DEADLINE_MS",
    "DEFAULT_KAFKA_VERSION",
    "DIGEST_BYTES",
    "ERROR",
    "LEGAL_TOPIC_RULE",
    "PURGATORY_NAMES",
    "REPLY_FROM",
    "REPLY_PARTITION",
    "REPLY_TOPIC",
    "TAIL_FETCH_WAIT_MS",
    "Appended",
    "AsyncKafkaPurgatory",
    "ChangeFeed",
    "ClusterFacts",
    "ClusterView",
    "CommitResult",
    "CorrelationKey",
    "DelayedConsumerCommit",
    "DelayedDeleteRecords",
    "DelayedFetch",
    "DelayedProduce",
    "DelayedReplication",
    "DelayedRequest",
    "DelayedTopicReady",
    "DeleteRecordsResult",
    "ErrorCode",
    "ErrorFact",
    "FactSource",
    "FeedStats",
    "FetchResult",
    "FetchedRecord",
    "GroupFacts",
    "GroupPartitionKey",
    "InvalidOffsetError",
    "InvalidTopicError",
    "KafkaAdapterError",
    "KafkaCalls",
    "KafkaClusterHandle",
    "KafkaConfigError",
    "KafkaKey",
    "KafkaLauncherError",
    "KafkaOperation",
    "KafkaPurgatory",
    "KafkaStartError",
    "KafkaUnavailableError",
    "LateReply",
    "LocalKafkaCluster",
    "Member",
    "Moved",
    "MovedReason",
    "NoLocalClusterError",
    "NodeNotRunningError",
    "OwnedOperation",
    "Owner",
    "OwnerProof",
    "OwnerStatus",
    "OwnersSnapshot",
    "OwnershipGuard",
    "OwnershipListener",
    "OwnershipStats",
    "PartitionFacts",
    "PartitionOwnership",
    "PartitionRead",
    "ProduceRequestKey",
    "ProduceResult",
    "ProducerRecord",
    "RecordIdentity",
    "RecordReader",
    "RecordSender",
    "RecordTooLargeError",
    "ReplicationResult",
    "Reply",
    "ReplyAddress",
    "ReplyRouter",
    "ReplyRouterStats",
    "Request",
    "RequestResult",
    "RequestTimeoutError",
    "Responder",
    "ResponderError",
    "ResponderStats",
    "SharedReadReader",
    "TopicFacts",
    "TopicKey",
    "TopicPartitionKey",
    "TopicReadyResult",
    "UnknownGroupError",
    "UnknownNodeError",
    "UnknownTopicError",
    "WatchedKeys",
    "check_client_config",
    "client_config",
    "configured_bootstrap",
    "create_topic",
    "delete_records",
    "describe_owners",
    "docker_available",
    "encode_partition",
    "header",
    "headers_of",
    "is_legal_topic",
    "provide_cluster",
    "redacted",
    "request_of",
    "resolve_kafka",
    "responder",
]
