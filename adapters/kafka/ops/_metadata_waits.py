"""Waits on the cluster's metadata, not on records: a group's commits, a topic's readiness, a
log start offset.

:class:`DelayedConsumerCommit` (a commit barrier), :class:`DelayedTopicReady` (a created topic with a
leader on every partition), :class:`DelayedDeleteRecords` (Kafka's DelayedDeleteRecords). The base
contract is :class:`KafkaOperation`'s (``_operations``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from purgatory import Outcome

from ..facts._facts import FactSource
from ..facts._keys import GroupPartitionKey, KafkaKey, TopicKey, TopicPartitionKey
from ._operations import (
    KafkaOperation,
    _require_offsets,
)
from ._results import (
    CommitResult,
    DeleteRecordsResult,
    ErrorCode,
    TopicReadyResult,
)

__all__ = ["DelayedConsumerCommit", "DelayedDeleteRecords", "DelayedTopicReady"]


class DelayedConsumerCommit(KafkaOperation):
    """Completes when a consumer group has committed at least ``targets[partition]`` on every partition.

    The "my message has been processed" barrier: produce, then wait until the consuming group's
    committed offset passes the record (target = record offset + 1). ``committed`` holds the
    last committed offsets seen; on expiry ``statuses`` shows ``REQUEST_TIMED_OUT`` where the
    group had not caught up.

    Attributes:
        group: the consumer group.
        targets: the committed offset waited for per partition.
        committed: the group's last committed offset seen per partition (``None``: none yet).
        statuses: filled when finished: ``NONE`` or ``REQUEST_TIMED_OUT`` per partition.

    ``result()`` returns these as a :class:`CommitResult` once finished.
    """

    def __init__(
        self,
        facts: FactSource,
        group: str,
        targets: Mapping[TopicPartitionKey, int],
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.commit_timeout_ms,
            facts,
            on_response=on_response,
        )
        if not isinstance(group, str) or not group:
            raise ValueError(f"group must be a non-empty string, got {group!r}")
        self.group = group
        self.targets = _require_offsets("DelayedConsumerCommit.targets", targets)
        self.committed: dict[TopicPartitionKey, int | None] = dict.fromkeys(self.targets)
        self.statuses: dict[TopicPartitionKey, ErrorCode] = {}
        # Partitions whose committed offset Kafka answered at least once: a None there means the
        # group has none (never seen, or never committed there), not "not asked yet".
        self.answered: set[TopicPartitionKey] = set()

    def _key(self, tp: TopicPartitionKey) -> GroupPartitionKey:
        return GroupPartitionKey(self.group, tp.topic, tp.partition)

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(self._key(tp) for tp in self.targets)

    def try_complete(self) -> bool:
        reached = True
        for tp, target in self.targets.items():
            facts = self.facts.group(self._key(tp))
            if facts is None or facts.error is not None:
                reached = False
                continue
            self.committed[tp] = facts.committed
            self.answered.add(tp)
            reached &= facts.committed is not None and facts.committed >= target
        return self.force_complete() if reached else False

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return self.targets

    def _respond(self) -> None:
        undecided = self._undecided_status()
        for tp, target in self.targets.items():
            if tp in self.statuses:
                continue  # refused (unknown partition), or moved
            done = (self.committed[tp] or -1) >= target
            self.statuses[tp] = ErrorCode.NONE if done else undecided

    @property
    def uncommitted(self) -> frozenset[TopicPartitionKey]:
        """The partitions where Kafka answered that the group has no committed offset."""
        return frozenset(tp for tp in self.answered if self.committed[tp] is None)

    def result(self) -> CommitResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        return CommitResult(
            outcome,
            self.group,
            dict(self.targets),
            dict(self.committed),
            dict(self.statuses),
            self.error,
            self.uncommitted,
        )


class DelayedTopicReady(KafkaOperation):
    """Completes when ``topic`` exists and every one of its partitions has a leader.

    A topic that does not exist yet is waited for (it may be being created); on expiry
    ``ready`` is False and ``leaders`` shows the last leaders seen.

    Attributes:
        key: the :class:`TopicKey` watched.
        ready: True once the topic exists and every partition has a leader.
        leaders: the leader per partition, as last seen.

    ``result()`` returns these as a :class:`TopicReadyResult` once finished.
    """

    def __init__(
        self,
        facts: FactSource,
        topic: str,
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.topic_ready_timeout_ms,
            facts,
            on_response=on_response,
        )
        self.key = TopicKey(topic)
        self.leaders: tuple[int, ...] = ()
        self.ready = False
        self.status: ErrorCode | None = None  # set when finished (or refused)

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return (self.key,)

    def try_complete(self) -> bool:
        facts = self.facts.topic(self.key)
        if facts is None or facts.error is not None:
            return False
        self.leaders = facts.leaders
        return self.force_complete() if facts.all_partitions_have_leaders else False

    def _set_status(self, key: TopicPartitionKey | None, code: ErrorCode) -> None:
        self.status = code

    def _respond(self) -> None:
        self.ready = self.outcome is Outcome.COMPLETED and self.status is None
        if self.status is None:
            self.status = ErrorCode.NONE if self.ready else self._undecided_status()

    def _respond_moved(self) -> None:
        self.status = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def _answer_statuses(self) -> tuple[ErrorCode | None]:
        return (self.status,)

    def result(self) -> TopicReadyResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        status = self.status or ErrorCode.REQUEST_TIMED_OUT
        return TopicReadyResult(outcome, self.key.topic, self.ready, self.leaders, self.error, status)


class DelayedDeleteRecords(KafkaOperation):
    """Completes when every partition's log start offset has reached its target (Kafka's low watermark).

    Issue the DeleteRecords request yourself (``AdminClient.delete_records``, or use
    ``KafkaPurgatory.delete_records`` which does both); this holds the response until the
    deletion is visible. ``log_start_offsets`` holds the last values seen.

    Attributes:
        targets: the log start offset waited for per partition.
        log_start_offsets: the log start offset last seen per partition.
        statuses: filled when finished: ``NONE``, ``UNKNOWN_TOPIC_OR_PARTITION`` or
            ``REQUEST_TIMED_OUT`` per partition.

    ``result()`` returns these as a :class:`DeleteRecordsResult` once finished.
    """

    needs_log_start = True

    def __init__(
        self,
        facts: FactSource,
        targets: Mapping[TopicPartitionKey, int],
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.delete_records_timeout_ms,
            facts,
            on_response=on_response,
        )
        self.targets = _require_offsets("DelayedDeleteRecords.targets", targets)
        self.log_start_offsets: dict[TopicPartitionKey, int | None] = dict.fromkeys(self.targets)
        self.statuses: dict[TopicPartitionKey, ErrorCode] = {}

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(self.targets)

    def try_complete(self) -> bool:
        reached = True
        for key, target in self.targets.items():
            facts = self.facts.partition(key)
            if facts is not None and facts.error is not None and facts.error.kind == "unknown_topic":
                self.statuses[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                return self._fail(facts.error.to_exception())
            start = facts.log_start_offset if facts is not None else None
            self.log_start_offsets[key] = start
            reached &= start is not None and start >= target
        return self.force_complete() if reached else False

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return self.targets

    def _respond(self) -> None:
        undecided = self._undecided_status()
        for key, target in self.targets.items():
            if key not in self.statuses:
                done = (self.log_start_offsets[key] or -1) >= target
                self.statuses[key] = ErrorCode.NONE if done else undecided

    def result(self) -> DeleteRecordsResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        return DeleteRecordsResult(
            outcome, dict(self.targets), dict(self.log_start_offsets), dict(self.statuses), self.error
        )
