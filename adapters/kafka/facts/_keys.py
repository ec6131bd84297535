"""Watch keys for Kafka facts: frozen, hashable, labelled as Kafka labels them (``orders-3``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..clients._errors import InvalidTopicError

__all__ = [
    "LEGAL_TOPIC_RULE",
    "GroupPartitionKey",
    "KafkaKey",
    "TopicKey",
    "TopicPartitionKey",
    "is_legal_topic",
]

# Kafka's legal topic names (Topic.validate): these characters, 1-249 of them, and not "." or ".."
# (legal characters, but the broker answers TOPIC_EXCEPTION).
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
LEGAL_TOPIC_RULE = "[a-zA-Z0-9._-], 1-249 characters, not . or .."


# Topics found legal, so that the keys and records built per request (a produce builds one of
# each per record) do not run the regex again: a set lookup instead of ~1 µs. Bounded: cleared
# when full (a process names far fewer topics than this in practice).
_LEGAL_SEEN: set[str] = set()
_LEGAL_SEEN_MAX = 4096


def is_legal_topic(topic: str) -> bool:
    """True if Kafka accepts ``topic`` as a topic name (fullmatch: no trailing newline slips by)."""
    if topic in _LEGAL_SEEN:
        return True
    if _LEGAL_TOPIC.fullmatch(topic) is None or topic in (".", ".."):
        return False
    if len(_LEGAL_SEEN) >= _LEGAL_SEEN_MAX:
        _LEGAL_SEEN.clear()
    _LEGAL_SEEN.add(topic)
    return True


def _check_topic(topic: object) -> None:
    """Refuse what Kafka would refuse, here: a key for a topic that cannot exist would otherwise
    cost a Kafka round trip (or a watch that waits for nothing) before its error came back."""
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a non-empty string, got {topic!r}")
    if not is_legal_topic(topic):
        raise InvalidTopicError(f"topic {topic!r} is not a legal Kafka topic name ({LEGAL_TOPIC_RULE})")


# Kafka's partition is an int32: librdkafka cannot even carry a larger one to the broker.
MAX_PARTITION = 2**31 - 1


def _check_partition(partition: object) -> None:
    if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition <= MAX_PARTITION:
        raise ValueError(f"partition must be an int from 0 to {MAX_PARTITION}, got {partition!r}")


class _HashSlot:
    """The slot a key caches its hash in, kept outside the dataclass's fields.

    A field (even ``field(init=False, repr=False, compare=False)``) shows in ``fields()``,
    ``asdict()``, ``astuple()`` and the pickled state; users treat a key as its plain values.
    """

    __slots__ = ("_hash",)
    _hash: int  # set once in the key's __post_init__


@dataclass(frozen=True, slots=True)
class TopicPartitionKey(_HashSlot):
    """One partition of a topic: high watermark, log start offset, leader and ISR are its facts."""

    topic: str
    partition: int
    # _hash (the slot of _HashSlot): the hash, computed once. A key event hashes its key ~10 times
    # per operation it completes (watch lists, facts, the record cache, the feed's bookkeeping),
    # and the dataclass's own __hash__ builds and hashes a tuple in Python each time (~1/8 of the
    # feed thread's time completing 10,000 long polls, cProfile). Same value as the generated one.

    def __post_init__(self) -> None:
        _check_topic(self.topic)
        _check_partition(self.partition)
        object.__setattr__(self, "_hash", hash((self.topic, self.partition)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[TopicPartitionKey], tuple[str, int]]:
        # Rebuilt from its values, never its stored hash: str hashes are salted per process
        # (PYTHONHASHSEED), so a hash pickled elsewhere would not find equal keys here.
        # Pinned by test_a_key_pickled_in_another_process_finds_equal_keys.
        return TopicPartitionKey, (self.topic, self.partition)

    @property
    def label(self) -> str:
        return f"{self.topic}-{self.partition}"  # Kafka's TopicPartition.toString()

    def __str__(self) -> str:
        return self.label


# Partition keys shared by the operations and answers of a partition (a long poll's watch key, a
# produce result's keys): one key and one topic string per partition instead of one per waiter
# (~120 B of each), and no key built, checked and hashed per request. Cleared when this many are
# held (topics come and go; a key made again is only a new object, never another partition).
INTERNED_KEYS = 65_536
_INTERNED: dict[tuple[str, int], TopicPartitionKey] = {}


def partition_key(topic: str, partition: int) -> TopicPartitionKey:
    """The shared :class:`TopicPartitionKey` of ``topic``/``partition`` (built, and checked, once)."""
    key = _INTERNED.get((topic, partition))
    if key is None:
        key = TopicPartitionKey(topic, partition)
        if len(_INTERNED) >= INTERNED_KEYS:
            _INTERNED.clear()
        _INTERNED[topic, partition] = key
    return key


@dataclass(frozen=True, slots=True)
class GroupPartitionKey:
    """A consumer group's position on one partition: its committed offset is the fact."""

    group: str
    topic: str
    partition: int

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or not self.group:
            raise ValueError(f"group must be a non-empty string, got {self.group!r}")
        _check_topic(self.topic)
        _check_partition(self.partition)

    @property
    def topic_partition(self) -> TopicPartitionKey:
        return TopicPartitionKey(self.topic, self.partition)

    @property
    def label(self) -> str:
        return f"{self.group}/{self.topic}-{self.partition}"

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class TopicKey:
    """A whole topic: existence and the leaders of its partitions are its facts."""

    topic: str

    def __post_init__(self) -> None:
        _check_topic(self.topic)

    @property
    def label(self) -> str:
        return self.topic

    def __str__(self) -> str:
        return self.label


KafkaKey = TopicPartitionKey | GroupPartitionKey | TopicKey
