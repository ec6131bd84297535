"""Moved: why an operation was answered early because its partition went to another instance.

Kafka's broker answers a produce or fetch waiting in its purgatory with ``NOT_LEADER_OR_FOLLOWER``
when the partition's leadership moves away; the client refreshes its metadata and retries at the
new leader. Here the unit that moves is a partition's *ownership* inside a group of service
instances (:mod:`._ownership`), and the answer carries where to retry when it is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Moved", "MovedReason"]

MovedReason = Literal["revoked", "lost", "shutdown", "not_owner"]


@dataclass(frozen=True, slots=True)
class Moved:
    """Where the operation's partition went: ``owner_url`` (None while the group rebalances)."""

    reason: MovedReason
    owner_url: str | None = None
    generation: int | None = None
