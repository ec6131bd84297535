"""How a :class:`KafkaPurgatory` takes an operation: checked, refused, or watched.

``submit`` / ``watch`` / ``watch_then_call`` (threads, a task, a callback on the loop) check the
operation's partitions first (one DescribeTopics: a partition that does not exist is answered
``UNKNOWN_TOPIC_OR_PARTITION`` at once), refuse it with ``SHUTTING_DOWN`` while the purgatory
closes, and otherwise hand it to the purgatory of its kind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from purgatory import DelayedOperationPurgatory, Outcome, PurgatoryClosedError

from ..clients._calls import KafkaCalls
from ..clients._errors import KafkaAdapterError, KafkaUnavailableError, UnknownTopicError
from ..facts._feed import ChangeFeed
from ..facts._keys import GroupPartitionKey, TopicKey, TopicPartitionKey
from ..facts._view import ClusterView
from ..ops._metadata_waits import DelayedTopicReady
from ..ops._operations import KafkaOperation
from ..ops._results import ErrorCode
from ._defaults import Op, _Missing

if TYPE_CHECKING:
    pass

__all__: list[str] = []


class _Submission:
    """Submission of operations (a base of :class:`KafkaPurgatory`, which sets the state)."""

    _close_done: bool
    _closed: bool
    calls: KafkaCalls
    feed: ChangeFeed
    view: ClusterView

    if TYPE_CHECKING:  # defined by KafkaPurgatory or another of its bases

        def _refuse(
            self,
            op: KafkaOperation,
            code: ErrorCode,
            error: KafkaAdapterError | None = None,
            keys: Iterable[TopicPartitionKey] | None = None,
        ) -> bool: ...

        def purgatory_for(self, op: KafkaOperation) -> DelayedOperationPurgatory[Any]: ...

    def _precheck(self, op: KafkaOperation) -> _Missing | None:
        """The operation's partitions Kafka says do not exist, with the error naming the first;
        None when every one exists or Kafka could not tell (one DescribeTopics request).

        Only Kafka's own "unknown topic" answer, or a partition past the topic's count, counts as
        missing: a cluster that did not answer concludes nothing (the operation then waits and
        says what it saw), so an outage is never reported as a missing topic.
        """
        if isinstance(op, DelayedTopicReady):
            return None  # waiting for the topic to appear is its point
        partitions: list[TopicPartitionKey] = []
        topics: set[str] = set()
        for key in op.watch_keys():
            if isinstance(key, TopicPartitionKey):
                partitions.append(key)
            elif isinstance(key, GroupPartitionKey):
                partitions.append(TopicPartitionKey(key.topic, key.partition))
            elif isinstance(key, TopicKey):
                topics.add(key.topic)
        topics.update(key.topic for key in partitions)
        if not topics:
            return None
        try:
            counts = self.view.partition_counts(topics)
        except KafkaAdapterError:
            return None  # not answered (or not an answer about existence): nothing to conclude

        def absent(key: TopicPartitionKey) -> bool:
            count = counts.get(key.topic, key.partition + 1)  # not in counts: nothing concluded
            return count is None or key.partition >= count

        missing = [key for key in partitions if absent(key)]
        missing_topics = sorted(t for t in topics if t in counts and counts[t] is None)
        if not missing and not missing_topics:
            return None
        first = missing[0] if missing else None
        detail = f"{type(op).__name__} answered UNKNOWN_TOPIC_OR_PARTITION at once"
        if first is None:
            error = UnknownTopicError(missing_topics[0], detail=detail)
        elif counts[first.topic] is None:
            error = UnknownTopicError(first.topic, detail=detail)
        else:
            error = UnknownTopicError(
                first.topic, first.partition, f"it has {counts[first.topic]} partitions; {detail}"
            )
        return missing, error

    def _refuse_unknown(self, op: KafkaOperation, refusal: _Missing) -> None:
        missing, error = refusal
        self._refuse(op, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error, missing or None)

    def _shutting_down(self, op: KafkaOperation) -> bool:
        """True (and ``op`` answered ``SHUTTING_DOWN``) iff stop() began and close() has not ended.

        Between the two a submission is not the caller's mistake but a request that raced the
        shutdown (a server still answering its last requests): it gets an answer, not an
        exception. After close() it is a closed object's misuse: ``PurgatoryClosedError``.
        """
        if not self._closed or self._close_done:
            return False
        self._refuse(op, ErrorCode.SHUTTING_DOWN)
        return True

    def submit(self, op: Op, *, validate: bool = True) -> Op:
        """Check the partitions exist, then ``try_complete_else_watch(op, op.watch_keys())`` in its
        purgatory; return ``op`` (finished at once when a partition does not exist, or when the
        purgatory is shutting down: see the module docstring)."""
        if self._shutting_down(op):
            return op
        if validate:
            refusal = self._precheck(op)
            if refusal is not None:
                self._refuse_unknown(op, refusal)
                return op
        try:
            purgatory = self.purgatory_for(op)
        except PurgatoryClosedError:
            if self._shutting_down(op):
                return op
            raise
        try:
            purgatory.try_complete_else_watch(op, op.watch_keys())
        except BaseException as exc:
            # Refused (PurgatoryFullError, closed, try_complete raised): make sure the feed does
            # not keep polling the op's keys (a no-op when the purgatory released them already).
            self._refused(purgatory.name, op)
            if isinstance(exc, PurgatoryClosedError) and self._shutting_down(op):
                return op
            raise
        return op

    async def watch(self, op: Op, *, validate: bool = True) -> Outcome:
        """asyncio: submit and await the outcome (the partition check runs on ``self.calls``,
        bounded; skipped while the feed sees Kafka unreachable: it could conclude nothing)."""
        if self._shutting_down(op):
            return self._outcome(op)
        if validate and self.feed.unavailable is None:
            try:
                refusal = await self.calls.run(
                    self._precheck, op, timeout_s=self.view.request_timeout_s + 1.0, what="DescribeTopics"
                )
            except KafkaUnavailableError:
                refusal = None  # not answered in time (or the pool is full): the op waits and says so
            if refusal is not None:
                self._refuse_unknown(op, refusal)
                return self._outcome(op)
        try:
            purgatory = self.purgatory_for(op)
        except PurgatoryClosedError:
            if self._shutting_down(op):
                return self._outcome(op)
            raise
        try:
            return await purgatory.watch(op, op.watch_keys())
        except BaseException as exc:
            self._refused(purgatory.name, op)  # as in submit(); a no-op once finished
            if isinstance(exc, PurgatoryClosedError) and self._shutting_down(op):
                return self._outcome(op)
            raise

    def _refused(self, purgatory: str, op: KafkaOperation) -> None:
        """A submission refused (PurgatoryFullError, closed, try_complete raised): the feed stops
        following the op's keys, and the op lets go of what its first try took (on_refused)."""
        self.feed.on_finished(purgatory, op)
        if not op.is_completed():
            op.on_refused()

    @staticmethod
    def _outcome(op: KafkaOperation) -> Outcome:
        outcome = op.outcome
        assert outcome is not None, f"{op!r} was answered without an outcome (refuse() finishes it)"
        return outcome

    def watch_then_call(
        self, op: Op, callback: Callable[[Op], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        """asyncio without a task: submit ``op`` (not validated); ``callback(op)`` on the loop once finished.

        See ``DelayedOperationPurgatory.watch_then_call`` (``loop``: the running loop, when the
        caller has it); the waiter gives up with ``purgatory_for(op).abandon(op)``.
        """
        purgatory = self.purgatory_for(op)
        try:
            purgatory.watch_then_call(op, op.watch_keys(), callback, loop)
        except BaseException:
            self._refused(purgatory.name, op)  # as in submit(); a no-op once finished
            raise

    def _watch_then_call_or_refuse(
        self, op: Op, callback: Callable[[Op], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> bool:
        """:meth:`watch_then_call`, or False with ``op`` answered ``SHUTTING_DOWN`` (see there)."""
        if self._shutting_down(op):
            return False
        try:
            self.watch_then_call(op, callback, loop)
        except PurgatoryClosedError:
            if self._shutting_down(op):
                return False
            raise
        return True
