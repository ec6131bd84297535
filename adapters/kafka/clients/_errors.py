"""Typed errors of the Kafka adapters, each naming what was asked and why it failed."""

from __future__ import annotations

from purgatory import PurgatoryError

__all__ = [
    "InvalidOffsetError",
    "InvalidTopicError",
    "KafkaAdapterError",
    "KafkaConfigError",
    "KafkaLauncherError",
    "KafkaStartError",
    "KafkaUnavailableError",
    "NoLocalClusterError",
    "NodeNotRunningError",
    "RecordTooLargeError",
    "UnknownGroupError",
    "UnknownNodeError",
    "UnknownTopicError",
]


class KafkaAdapterError(PurgatoryError):
    """Base of every error raised by ``purgatory.adapters.kafka``."""


class KafkaUnavailableError(KafkaAdapterError):
    """The cluster did not answer (unreachable, timed out, or every broker down)."""


class UnknownTopicError(KafkaAdapterError, LookupError):
    """A topic (or a partition of it) does not exist on the cluster."""

    def __init__(
        self, topic: str, partition: int | None = None, detail: str = "", *, message: str | None = None
    ) -> None:
        what = f"topic {topic!r}" if partition is None else f"partition {partition} of topic {topic!r}"
        super().__init__(
            message or f"{what} does not exist on the cluster" + (f" ({detail})" if detail else "")
        )
        self.topic = topic
        self.partition = partition


class UnknownGroupError(KafkaAdapterError, LookupError):
    """A consumer group is not known to the cluster."""


class InvalidOffsetError(KafkaAdapterError, ValueError):
    """An offset is out of range or negative where a position is required."""


class KafkaLauncherError(KafkaAdapterError):
    """The local Kafka cluster could not be resolved, formatted, started or stopped."""


class KafkaStartError(KafkaLauncherError):
    """A node did not come up in time; the message carries the tail of its logs."""


class NoLocalClusterError(KafkaLauncherError, LookupError):
    """No local cluster state where one was asked for (never started, or ``kafka down`` ran)."""


class UnknownNodeError(KafkaLauncherError, ValueError):
    """A node id the local cluster does not have (a ``ValueError``, as before it was typed)."""

    def __init__(self, node_id: int, nodes: list[int]) -> None:
        super().__init__(f"no node {node_id} in this cluster (nodes {', '.join(map(str, nodes))})")
        self.node_id = node_id
        self.nodes = nodes


class NodeNotRunningError(KafkaLauncherError):
    """A signal (pause, resume) asked of a node that is not running: there is no process to signal."""


class InvalidTopicError(KafkaAdapterError, ValueError):
    """A topic name Kafka refuses (TOPIC_EXCEPTION: ``.``, ``..``, illegal characters, too long).

    Keys and records check the name when built (the rule is Kafka's ``Topic.validate``); Kafka's
    own refusal of a name (a stricter broker) surfaces as this error too.
    """


class RecordTooLargeError(KafkaAdapterError, ValueError):
    """A record is larger than the producer's ``message.max.bytes`` or the topic's ``max.message.bytes``."""


class KafkaConfigError(KafkaAdapterError, ValueError):
    """librdkafka refused the client configuration (unknown property, bad value, unsupported SASL)."""
