"""OwnedFetch, OwnedReplication: the off-loop operations of a scaled-out service, moving with their partition.

With ``scaleout.enabled`` an instance serves only the partitions its ownership group assigns it:
a long poll or a replication wait whose partition moves while it waits is finished MOVED (its
client retries at the new owner). :class:`OwnedOperation` (listed first) asks the operation's
placement at the start of every ``try_complete``; the rest is :class:`OffLoopFetch` and
:class:`OffLoopReplication` as they are.
"""

from __future__ import annotations

from ..ownership._ownership_guard import OwnedOperation
from ._off_loop import OffLoopReplication
from ._off_loop_fetch import OffLoopFetch

__all__ = ["OwnedFetch", "OwnedReplication"]


class OwnedFetch(OwnedOperation, OffLoopFetch):
    """A long poll that moves when its partition does (see :class:`OwnedOperation`)."""


class OwnedReplication(OwnedOperation, OffLoopReplication):
    """A replication wait (``/replicated``) that moves when its partition does."""


# Journals and analytics group operations by class name: to them these are Kafka's operations.
OwnedFetch.__name__ = OwnedFetch.__qualname__ = "DelayedFetch"
OwnedReplication.__name__ = OwnedReplication.__qualname__ = "DelayedReplication"
