"""OwnershipGuard: no operation keeps waiting on an instance that no longer owns its partition.

Kafka's lesson (KAFKA-19567): a delayed operation left waiting on a broker that lost the
partition's leadership is answered late or never. Here, when :class:`PartitionOwnership` revokes
partitions (a rebalance, this instance stopping, the session lost), the guard takes every
operation watched on them out of the purgatories (``cancel_for_key``: unwatched, no longer timed)
and finishes it at once with a :class:`Moved` answer — ``KafkaOperation.move``: COMPLETED, each
waiting partition ``NOT_LEADER_OR_FOLLOWER`` — so its client retries at the new owner. An
operation of another type (no ``move``) is expired at once instead: nobody waits in vain.

The race with submission: the ownership layer first marks partitions not owned, then calls
:meth:`on_revoked`. A submitter calls :meth:`recheck` *after* its operation is watched:

1. watched before the sweep's ``cancel_for_key`` → the sweep finds and moves it;
2. watched after it → the partition was already marked not owned, so ``recheck`` moves it.

Either way it finishes at once, exactly once (finishing is claimed).

New ownership starts from current facts: the change feed polls only watched keys, and a moved
partition's keys are released by the feed when its operations finish, so the first operation
watched on a newly assigned partition is checked against facts polled for it then.

Concurrency contract: ``on_revoked``/``on_assigned`` run on the ownership's thread; ``recheck``
and ``submit`` on any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Protocol

import structlog

from purgatory import DelayedOperation, DelayedOperationPurgatory

from ..facts._keys import GroupPartitionKey, KafkaKey, TopicPartitionKey
from ..ops._moved import Moved
from ._ownership import PartitionOwnership

__all__ = ["OwnedOperation", "OwnershipGuard", "WatchedKeys"]

_log = structlog.get_logger("purgatory.kafka.ownership")


class WatchedKeys(Protocol):
    """Where the guard learns which keys are watched (the change feed)."""

    def watched_keys(self) -> frozenset[KafkaKey]: ...


def _partition_of(key: Hashable) -> TopicPartitionKey | None:
    if isinstance(key, TopicPartitionKey):
        return key
    if isinstance(key, GroupPartitionKey):
        return TopicPartitionKey(key.topic, key.partition)
    return None


class OwnershipGuard:
    """Moves the operations of revoked partitions (see the module docstring)."""

    def __init__(
        self,
        ownership: PartitionOwnership,
        purgatories: Sequence[DelayedOperationPurgatory[Any]],
        watched: WatchedKeys | None = None,
        *,
        on_moved: Callable[[DelayedOperation, Moved], None] | None = None,
    ) -> None:
        self.ownership = ownership
        self.purgatories = tuple(purgatories)
        self.watched = watched
        self.on_moved = on_moved
        self.moved = 0  # operations finished with a Moved answer
        self.expired = 0  # operations without move() expired at once instead
        ownership.add_listener(self)

    def close(self) -> None:
        self.ownership.remove_listener(self)

    # -- OwnershipListener ----------------------------------------------------------------------

    def on_assigned(self, partitions: frozenset[TopicPartitionKey], generation: int) -> None:
        """Nothing to carry over: the first operation on a new partition gets fresh facts polled."""

    def on_revoked(self, partitions: frozenset[TopicPartitionKey], moved: Moved) -> None:
        keys: set[Hashable] = set(partitions)
        if self.watched is not None:
            # Operations watched on a group's offsets of a revoked partition move with it.
            keys |= {k for k in self.watched.watched_keys() if _partition_of(k) in partitions}
        count = 0
        for purgatory in self.purgatories:
            for key in keys:
                for op in purgatory.cancel_for_key(key):
                    count += self._move(op, moved)
        if count:
            _log.info(
                "ownership_moved_operations", count=count, partitions=len(partitions), reason=moved.reason
            )

    # -- submission side ------------------------------------------------------------------------

    def recheck(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """After ``op`` was watched: if a key's partition is no longer ours, move ``op`` now.

        Returns True if it was moved. Call it once the operation is watched (see the module
        docstring for why that order closes the race with a revocation).
        """
        for key in keys:
            tp = _partition_of(key)
            if tp is None:
                continue
            owner = self.ownership.owner(tp)
            if owner.served_here:
                continue
            moved = Moved("not_owner", owner.url, owner.generation)
            return bool(self._move(op, moved))
        return False

    def submit(
        self, purgatory: DelayedOperationPurgatory[Any], op: DelayedOperation, keys: Sequence[Hashable]
    ) -> bool:
        """``try_complete_else_watch`` then :meth:`recheck`: a library user's ownership-safe submit."""
        completed = purgatory.try_complete_else_watch(op, keys)
        if not completed:
            self.recheck(op, keys)
        return completed

    def placement(self, keys: Iterable[Hashable]) -> Callable[[], Moved | None]:
        """A check for :class:`OwnedOperation`: None while every key's partition is ours."""
        partitions = tuple(tp for tp in map(_partition_of, keys) if tp is not None)
        ownership = self.ownership

        def check() -> Moved | None:
            owned = ownership.owned()  # one attribute read: the common case costs a set lookup
            for tp in partitions:
                if tp in owned:
                    continue
                owner = ownership.owner(tp)
                if not owner.served_here:
                    return Moved("not_owner", owner.url, owner.generation)
            return None

        return check

    def _move(self, op: DelayedOperation, moved: Moved) -> int:
        move = getattr(op, "move", None)
        if callable(move):
            finished = bool(move(moved))
            self.moved += finished
        else:
            # Not movable: answer now (expired) rather than wait where it can no longer finish.
            # cancel_for_key took it out of the timer, so this run() is its only expiry.
            already = op.is_completed()
            op.run()
            finished = not already
            self.expired += finished
        if finished and self.on_moved is not None:
            try:
                self.on_moved(op, moved)
            except Exception:
                _log.exception("ownership_on_moved_failed", operation=type(op).__name__)
        return int(finished)


class OwnedOperation:
    """Mixin (list it first) for an operation that must move when its partition does.

    ``op.placement`` (from :meth:`OwnershipGuard.placement`) is asked at the start of every
    ``try_complete``: the purgatory's second try runs *after* the operation is watched and under
    ``op.lock``, so an operation submitted while its partition is being revoked is moved by that
    try or found by the guard's sweep — never left waiting (module docstring, steps 1-2).
    """

    placement: Callable[[], Moved | None] | None = None

    def try_complete(self) -> bool:
        placement = self.placement
        if placement is not None:
            moved = placement()
            if moved is not None:
                return bool(self.move(moved))  # type: ignore[attr-defined]
        return bool(super().try_complete())  # type: ignore[misc]
