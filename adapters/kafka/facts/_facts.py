"""The facts delayed operations read about a Kafka cluster, as comparable values, and where they
read them from (:class:`FactSource`: the change feed's snapshot, or a test's fake).

:class:`ClusterView` (``_view.py``) answers with these values; the change feed (``_feed.py``)
keeps the latest ones per watched key; operations (``_operations.py``) read them. A per-key
failure is an :class:`ErrorFact` (exceptions do not compare by value); ``_error_fact`` maps a
client error to one: "the cluster did not answer" vs "it answered no".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from confluent_kafka import KafkaError, KafkaException

from ..clients._errors import (
    InvalidOffsetError,
    InvalidTopicError,
    KafkaAdapterError,
    KafkaUnavailableError,
    UnknownGroupError,
    UnknownTopicError,
)
from ..settings import KafkaSettings
from ._keys import GroupPartitionKey, TopicKey, TopicPartitionKey

__all__ = [
    "NO_LEADER",
    "ClusterFacts",
    "ErrorFact",
    "FactSource",
    "GroupFacts",
    "PartitionFacts",
    "TopicFacts",
]

NO_LEADER = -1

# librdkafka codes meaning "the cluster did not answer", as opposed to "it answered no".
_UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        # A new leader answers ListOffsets with this until its high watermark caught up with
        # the start of its epoch: a moment after every election.
        KafkaError.OFFSET_NOT_AVAILABLE,
        # The client's idea of the leader epoch is behind or ahead of the broker's: metadata is
        # catching up with an election.
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)
_UNKNOWN_TOPIC_CODES = frozenset(
    # _NOENT: ListOffsets found no leader for the partition (librdkafka says "No leaders found").
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._NOENT,
    }
)


@dataclass(frozen=True, slots=True)
class ErrorFact:
    """A per-key failure as a comparable value (exceptions do not compare by value)."""

    kind: Literal["unknown_topic", "unavailable", "invalid_offset", "unknown_group", "invalid_topic", "other"]
    message: str
    topic: str | None = None
    partition: int | None = None

    def to_exception(self) -> KafkaAdapterError:
        """The typed error this fact stands for."""
        if self.kind == "unknown_topic":
            return UnknownTopicError(self.topic or "?", self.partition, message=self.message)
        if self.kind == "unavailable":
            return KafkaUnavailableError(self.message)
        if self.kind == "invalid_offset":
            return InvalidOffsetError(self.message)
        if self.kind == "unknown_group":
            return UnknownGroupError(self.message)
        if self.kind == "invalid_topic":
            return InvalidTopicError(self.message)
        return KafkaAdapterError(self.message)


@dataclass(frozen=True, slots=True)
class PartitionFacts:
    """What the cluster says about one partition (``None``: not asked or not known yet)."""

    high_watermark: int | None = None
    log_start_offset: int | None = None
    leader: int = NO_LEADER
    # The partition leader's epoch, from the same ListOffsets answer as the high watermark: the
    # watermark is a position in the log of that epoch's leader (see DelayedReplication).
    leader_epoch: int | None = None
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()
    min_insync_replicas: int | None = None
    error: ErrorFact | None = None

    @property
    def under_min_isr(self) -> bool:
        """True when the ISR is known and smaller than ``min.insync.replicas``."""
        min_isr = self.min_insync_replicas
        return min_isr is not None and 0 < len(self.isr) < min_isr


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """A topic's partitions and their leaders (``NO_LEADER`` when a partition has none)."""

    leaders: tuple[int, ...] = ()
    error: ErrorFact | None = None

    @property
    def all_partitions_have_leaders(self) -> bool:
        return bool(self.leaders) and all(leader != NO_LEADER for leader in self.leaders)


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """A group's committed offset on a partition (``None``: nothing committed)."""

    committed: int | None = None
    error: ErrorFact | None = None


@dataclass(frozen=True)
class ClusterFacts:
    """One batch of facts, per key."""

    partitions: dict[TopicPartitionKey, PartitionFacts] = field(default_factory=dict)
    topics: dict[TopicKey, TopicFacts] = field(default_factory=dict)
    groups: dict[GroupPartitionKey, GroupFacts] = field(default_factory=dict)


class FactSource(Protocol):
    """Where operations read facts (the feed; tests may pass a fake)."""

    settings: KafkaSettings

    def partition(self, key: TopicPartitionKey) -> PartitionFacts | None: ...

    def topic(self, key: TopicKey) -> TopicFacts | None: ...

    def group(self, key: GroupPartitionKey) -> GroupFacts | None: ...

    @property
    def unavailable(self) -> str | None: ...


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return int(exc.args[0].code())
    return None


def _error_fact(
    exc: BaseException, what: str, topic: str | None = None, partition: int | None = None
) -> ErrorFact:
    code = _code(exc)
    detail = str(exc.args[0]) if exc.args else repr(exc)
    if code in _UNKNOWN_TOPIC_CODES:
        return ErrorFact(
            "unknown_topic", f"{what} does not exist on the cluster ({detail})", topic, partition
        )
    if code in _UNAVAILABLE_CODES:
        return ErrorFact("unavailable", f"Kafka did not answer for {what} ({detail})")
    if code == KafkaError.OFFSET_OUT_OF_RANGE:
        return ErrorFact("invalid_offset", f"offset out of range for {what} ({detail})")
    if code == KafkaError.GROUP_ID_NOT_FOUND:
        return ErrorFact("unknown_group", f"{what}: consumer group not found ({detail})")
    if code == KafkaError.TOPIC_EXCEPTION:
        return ErrorFact(
            "invalid_topic", f"{what}: Kafka refused the topic name ({detail})", topic, partition
        )
    return ErrorFact("other", f"{what}: {detail}")


def _translate(exc: BaseException, what: str) -> KafkaAdapterError:
    return _error_fact(exc, what).to_exception()


def _unavailable_or(exc: KafkaException, what: str) -> KafkaAdapterError:
    """A request that could not even be sent: the client's error, typed."""
    return _translate(exc, what)
