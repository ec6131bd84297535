"""Admin requests a service issues itself: create a topic, delete records.

Thin wrappers over ``AdminClient.create_topics`` / ``delete_records`` that translate librdkafka's
errors to the adapter's typed ones. They only *issue* the request; waiting until its effect is
visible (leaders elected, log start offsets moved) is the purgatory's job
(:class:`DelayedTopicReady`, :class:`DelayedDeleteRecords`), as on the broker.

Concurrency: thread-safe (the AdminClient is); each call blocks for at most ``timeout_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ..facts._keys import TopicPartitionKey
from ._clients import _typed
from ._errors import KafkaAdapterError, KafkaUnavailableError, UnknownTopicError

__all__ = ["create_topic", "delete_records"]

BROKER_DEFAULT = -1  # NewTopic: partitions / replication factor from the broker's defaults (KIP-464)


_UNKNOWN_TOPIC_CODES = (
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
)


def _error(exc: BaseException, what: str, topic: str, partition: int | None = None) -> KafkaAdapterError:
    if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError):
        error = exc.args[0]
        if error.code() in _UNKNOWN_TOPIC_CODES:
            return UnknownTopicError(topic, partition, detail=f"{what}: {error.str()}")
        return _typed(error, what)
    if isinstance(exc, FutureTimeout | TimeoutError):
        return KafkaUnavailableError(f"{what}: Kafka did not answer in time")
    return KafkaAdapterError(f"{what}: {exc}")


def create_topic(
    admin: AdminClient,
    topic: str,
    *,
    partitions: int = BROKER_DEFAULT,
    replication_factor: int = BROKER_DEFAULT,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> bool:
    """Create ``topic``; True if this call created it, False if it already existed.

    Any other refusal (invalid name, replication factor above the broker count, unreachable
    cluster) raises the typed :class:`KafkaAdapterError` naming the topic.
    """
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a non-empty string, got {topic!r}")
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or {}),
    )
    futures = admin.create_topics([new], request_timeout=timeout_s, operation_timeout=timeout_s)
    try:
        futures[topic].result(timeout=timeout_s + 1.0)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise _error(exc, f"create topic {topic!r}", topic) from None
    except FutureTimeout as exc:
        raise _error(exc, f"create topic {topic!r}", topic) from None
    return True


def delete_records(
    admin: AdminClient, before: Mapping[TopicPartitionKey, int], *, timeout_s: float = 30.0
) -> None:
    """Ask the leaders to delete every record before ``before[partition]`` (Kafka's DeleteRecords).

    Returns once the leaders accepted the request (``operation_timeout=0``): the log start
    offsets move as the replicas follow, which :class:`DelayedDeleteRecords` waits for.
    """
    if not before:
        raise ValueError("delete_records needs at least one partition")
    partitions = [TopicPartition(key.topic, key.partition, offset) for key, offset in before.items()]
    futures = admin.delete_records(partitions, request_timeout=timeout_s, operation_timeout=0)
    for tp, future in futures.items():
        try:
            future.result(timeout=timeout_s + 1.0)
        except (KafkaException, FutureTimeout) as exc:
            what = f"delete records of {tp.topic}-{tp.partition} before offset {tp.offset}"
            raise _error(exc, what, tp.topic, tp.partition) from None
