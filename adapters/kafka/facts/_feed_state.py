"""What the change feed's parts share: the published snapshot, its counters, what it talks to.

The feed (``_feed``: the poll thread and the composition), its key registry (``_feed_keys``) and
its waker (``_feed_waker``) all read or publish :class:`_Snapshot` and count in :class:`FeedStats`.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from purgatory import PurgatoryListener

from ..clients._clients import FetchedRecord
from ._facts import GroupFacts, PartitionFacts, TopicFacts
from ._keys import GroupPartitionKey, KafkaKey, TopicKey, TopicPartitionKey

__all__ = ["FeedStats", "Purgatoryish", "RecordSink"]


class Purgatoryish(Protocol):
    """What the feed needs of a purgatory (``DelayedOperationPurgatory`` satisfies it)."""

    name: str

    def check_and_complete(self, key: Hashable) -> int: ...

    def add_listener(self, listener: PurgatoryListener) -> None: ...

    def remove_listener(self, listener: PurgatoryListener) -> None: ...


class RecordSink(Protocol):
    """Where the push feed hands the records its tail fetched (the service's shared record cache)."""

    def append(self, key: TopicPartitionKey, records: list[FetchedRecord]) -> None: ...


@dataclass
class FeedStats:
    """Counters of the feed's work (read by the benchmark and by tests)."""

    polls: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    reconnects: int = 0
    keys_changed: int = 0
    pushes_withheld: int = 0  # tail positions from a leader newer than the facts' (see _pushed)
    checks: int = 0  # check_and_complete calls (one per changed key per purgatory watching it)
    indexed_wakes: int = 0  # high-watermark advances served by the offset index instead
    indexed_tries: int = 0  # operations those tried: what they could complete, not all waiters
    last_error: str | None = None
    poll_ms: list[float] = field(default_factory=list)
    # time.monotonic() of the last poll that refreshed the facts from Kafka; the feed's creation
    # until the first one, so that an outage from the start ages too (the feed-health metric).
    last_success: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Snapshot:
    partitions: dict[TopicPartitionKey, PartitionFacts]
    topics: dict[TopicKey, TopicFacts]
    groups: dict[GroupPartitionKey, GroupFacts]
    unavailable: str | None = None


_EMPTY = _Snapshot({}, {}, {})


class _Observer(Protocol):
    def __call__(self, changed: list[KafkaKey], /) -> None: ...
