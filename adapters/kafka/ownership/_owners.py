"""The ownership group as DescribeConsumerGroups shows it: members, who owns which partition,
and the answer to "where is this key served" (:class:`Owner`).

Read by :class:`._ownership.PartitionOwnership` (which refreshes a snapshot on its group thread)
and by ``purgatory kafka owners`` (:func:`describe_owners`, one request). Members are believed
only when they prove they are instances (:class:`._owner_proof.OwnerProof`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from ..clients._config import client_config
from ..facts._keys import TopicPartitionKey
from ..settings import KafkaSettings, ScaleOutSettings
from ._owner_proof import OwnerProof

__all__ = [
    "NO_SNAPSHOT",
    "SERVED_HERE",
    "STABLE",
    "Member",
    "Owner",
    "OwnerStatus",
    "OwnersSnapshot",
    "describe_group",
    "describe_owners",
    "keys_of",
    "snapshot_of",
]

STABLE = "STABLE"


@dataclass(frozen=True, slots=True)
class Member:
    """One member of the group: its member id, advertised URL (from its ``client.id``), partitions,
    and whether it proved it is an instance (``distrust`` says why not)."""

    member_id: str
    url: str
    host: str
    partitions: frozenset[TopicPartitionKey]
    trusted: bool = True
    distrust: str | None = None


@dataclass(frozen=True, slots=True)
class OwnersSnapshot:
    """The group as DescribeConsumerGroups last showed it."""

    group: str
    state: str
    members: tuple[Member, ...]
    owners: dict[TopicPartitionKey, Member]
    taken_at: float  # time.monotonic()

    @property
    def stable(self) -> bool:
        return self.state == STABLE


NO_SNAPSHOT = OwnersSnapshot("", "UNKNOWN", (), {}, float("-inf"))


class OwnerStatus(StrEnum):
    """Where a key's partition is served."""

    SELF = "SELF"  # this instance owns it: serve here
    OTHER = "OTHER"  # another member owns it: redirect or forward to ``Owner.url``
    NONE = "NONE"  # no owner known right now (rebalancing, or just revoked): retry after a moment
    UNMANAGED = "UNMANAGED"  # not a topic of the group: any instance serves it
    # Held by a member that did not prove it is an instance (OwnerProof), or by another member
    # claiming this instance's own URL: serve it here, never send a client or a request there.
    UNTRUSTED = "UNTRUSTED"


SERVED_HERE = frozenset({OwnerStatus.SELF, OwnerStatus.UNMANAGED, OwnerStatus.UNTRUSTED})


@dataclass(frozen=True, slots=True)
class Owner:
    """Answer to "who owns this key": ``status``, the owner's ``url`` and whether it is moving."""

    status: OwnerStatus
    url: str | None = None
    moving: bool = False  # the assignment is changing: the answer may be stale, retry after a moment
    generation: int = 0

    @property
    def served_here(self) -> bool:
        """True when this instance answers the key itself (owned, unmanaged or untrusted owner)."""
        return self.status in SERVED_HERE


def keys_of(partitions: Iterable[TopicPartition]) -> frozenset[TopicPartitionKey]:
    return frozenset(TopicPartitionKey(tp.topic, tp.partition) for tp in partitions)


def describe_group(admin: AdminClient, group: str, timeout_s: float) -> Any:
    futures = admin.describe_consumer_groups([group], request_timeout=timeout_s)
    return futures[group].result(timeout=timeout_s + 1.0)


def snapshot_of(group: str, description: Any, proof: OwnerProof) -> OwnersSnapshot:
    owners: dict[TopicPartitionKey, Member] = {}
    members = []
    for m in description.members:
        parts = keys_of(m.assignment.topic_partitions if m.assignment is not None else ())
        verdict = proof.verify(m.client_id or "")
        member = Member(m.member_id, verdict.url, m.host, parts, verdict.trusted, verdict.reason)
        members.append(member)
        for key in parts:
            owners[key] = member
    state = getattr(description.state, "name", str(description.state))
    return OwnersSnapshot(group, state, tuple(sorted(members, key=lambda m: m.url)), owners, time.monotonic())


def describe_owners(
    settings: KafkaSettings,
    group: str,
    *,
    bootstrap_servers: str | None = None,
    scaleout: ScaleOutSettings | None = None,
) -> OwnersSnapshot:
    """The ownership group as Kafka describes it now (``purgatory kafka owners``): one request.

    Members are checked against ``scaleout``'s secret and trusted URLs (none given: none trusted).
    """
    admin = AdminClient({**client_config(settings, bootstrap_servers), "log_level": "0"})
    proof = OwnerProof(group, scaleout.secret, scaleout.trusted_urls) if scaleout else OwnerProof(group, None)
    return snapshot_of(group, describe_group(admin, group, settings.request_timeout_ms / 1000.0), proof)
