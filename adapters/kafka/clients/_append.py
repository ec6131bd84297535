"""Appended: offsets someone appended, with what vouches for them (for :class:`DelayedReplication`).

Until 2026-11 produces were ``acks=1`` appends (``FencedAppender``) followed by a watch of the
high watermark, and this module noted each partition's leader epoch before the append and the
identities of the records appended. Produces are ``acks=all`` through the idempotent producer
now (``_produce.DelayedProduce``): the leader's own purgatory does the replication wait. What
stays is the description of a wait for offsets appended elsewhere — ``GET
/topics/{t}/replicated?offsets=&epochs=&records=`` — whose epochs and record identities still
protect that caller: a record lost to a leader change is answered ``NOT_LEADER_OR_FOLLOWER``,
never "replicated" because another record now sits at its offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..facts._keys import TopicPartitionKey
from ._clients import FetchedRecord, RecordIdentity

__all__ = ["Appended", "RecordReading"]


class RecordReading(Protocol):
    """Reads a range of a partition's records (:class:`RecordReader`, :class:`SharedReadReader`)."""

    def read(
        self, key: TopicPartitionKey, start: int, end: int, *, max_bytes: int
    ) -> list[FetchedRecord]: ...


@dataclass(frozen=True, slots=True)
class Appended:
    """Records a leader appended: the last offset per partition, and each partition's leader
    epoch as known before the append (see the module docstring).

    With ``read_back`` (per partition, the identities of its first and last record appended) and
    a ``reader``, :class:`DelayedReplication` reads those records back before answering ``NONE``.
    Without them (offsets and epochs alone) only the epoch fences: an ``acks=1`` append by a
    deposed leader that did not know it yet is not seen.
    """

    offsets: Mapping[TopicPartitionKey, int]
    leader_epochs: Mapping[TopicPartitionKey, int]
    read_back: Mapping[TopicPartitionKey, tuple[RecordIdentity, ...]] = field(default_factory=dict)
    reader: RecordReading | None = None
