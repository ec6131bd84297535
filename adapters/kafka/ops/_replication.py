"""DelayedReplication: an append waits until every in-sync replica holds it (acks=all's wait).

Kafka's DelayedProduce wait on the high watermark, as its own operation: it holds the answer for
records someone appended until each partition's high watermark passes them, re-reading them back
if the leader changed meanwhile. The base contract is :class:`KafkaOperation`'s (``_operations``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ..clients._append import Appended, RecordReading
from ..clients._clients import RecordIdentity
from ..clients._errors import KafkaAdapterError
from ..facts._facts import FactSource, PartitionFacts
from ..facts._keys import KafkaKey, TopicPartitionKey
from ._operations import (
    KafkaOperation,
    _require_offsets,
)
from ._results import (
    ErrorCode,
    ReplicationResult,
)

__all__ = ["DelayedReplication"]


# A replication wait's read-back reads on to the high watermark, this far (DelayedReplication._read_back).
READ_BACK_MAX_BYTES = 64 << 10


class DelayedReplication(KafkaOperation):
    """Holds an answer until every partition's high watermark passes an offset someone appended.

    (Until 2026-11 this was ``DelayedProduce`` itself, behind an ``acks=1`` append; a produce now
    waits for the idempotent producer's ``acks=all`` delivery reports, :class:`DelayedProduce`
    in ``_produce.py``. What stays here is the wait for offsets appended elsewhere:
    ``GET /topics/{t}/replicated``, ``kp.wait_replicated``.)

    ``appended`` says, per partition, the last offset to wait for and, when the caller knows it,
    the leader epoch that offset was appended in (an :class:`Appended`). A partition is done when
    the high watermark of that leader epoch passes the offset — every in-sync replica has the
    record — with status ``NONE``; with ``NOT_LEADER_OR_FOLLOWER`` as soon as the facts show
    another epoch (the leader changed: a record only the old leader had may be lost, and the new
    leader's watermark counts other records at its offset — Kafka's broker fails a waiting
    produce the same way); or with ``NOT_ENOUGH_REPLICAS`` as soon as its ISR is smaller than
    ``min.insync.replicas`` (Kafka 4 then keeps the high watermark still, see ``_status``). An
    unknown partition is done with ``UNKNOWN_TOPIC_OR_PARTITION``. On expiry the partitions still
    waiting get ``REQUEST_TIMED_OUT``. ``statuses`` holds the per-partition result.

    What the epoch fence protects, now that produces are ``acks=all``: a caller that appended
    with ``acks=1`` itself (or learnt an offset and epoch from one who did) is told when its
    record may have been lost to a leader change instead of being told a watermark passed.
    When ``appended`` also carries the identities of each partition's first and last record and
    a reader, ``NONE`` needs those records read back at their offsets (below the high watermark,
    so replicated): an epoch noted before an ``acks=1`` append cannot name a deposed leader that
    appended it without knowing it was deposed; another record there is
    ``NOT_LEADER_OR_FOLLOWER``. A read that brings nothing now (a stalled broker) leaves the
    partition waiting for the next change of its facts.

    ``appended`` may also be a plain mapping of *target* offsets (wait until the watermark
    reaches a position, whoever writes there): the epoch is then the one the facts show at
    construction, or the first one they show.

    Attributes:
        appended: last offset the leader appended per partition.
        leader_epochs: the leader epoch each partition's offset belongs to (None: not known yet).
        statuses: per partition, ``None`` while waiting, then the final :class:`ErrorCode`.
        succeeded: True iff every partition ended ``NONE``.

    ``result()`` returns these as a :class:`ReplicationResult` once finished.
    """

    def __init__(
        self,
        facts: FactSource,
        appended: Appended | Mapping[TopicPartitionKey, int],
        *,
        delay_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            delay_ms if delay_ms is not None else facts.settings.produce_timeout_ms,
            facts,
            on_response=on_response,
        )
        self.statuses: dict[TopicPartitionKey, ErrorCode | None]
        # The reference epoch per partition; None: adopt the first one the facts show.
        self.leader_epochs: dict[TopicPartitionKey, int | None]
        # The records each partition must hold to be answered NONE, and how to read them.
        self.read_back: Mapping[TopicPartitionKey, tuple[RecordIdentity, ...]] = {}
        self.reader: RecordReading | None = None
        # Records appended (an Appended, the epochs noted before the append), not plain targets:
        # the fence must go wherever the wait goes (a MOVED answer, the service's _scaleout).
        self.fenced = isinstance(appended, Appended)
        if isinstance(appended, Appended):
            if appended.reader is not None:
                self.read_back, self.reader = appended.read_back, appended.reader
            self.appended = _require_offsets("DelayedReplication.appended", appended.offsets)
            self.leader_epochs = {k: appended.leader_epochs.get(k) for k in self.appended}
            # A partition whose epoch before the append is unknown (it did not exist yet when
            # the epochs were taken) cannot be vouched for: the client must retry.
            self.statuses = {
                k: None if e is not None else ErrorCode.NOT_LEADER_OR_FOLLOWER
                for k, e in self.leader_epochs.items()
            }
        else:
            self.appended = _require_offsets("DelayedReplication.appended", appended)
            self.leader_epochs = {k: _epoch_of(facts.partition(k)) for k in self.appended}
            self.statuses = dict.fromkeys(self.appended)
        self._single: tuple[TopicPartitionKey, int, int | None] | None = None
        if len(self.appended) == 1 and None in self.statuses.values():
            ((key, offset),) = self.appended.items()
            self._single = (key, offset, self.leader_epochs[key])

    # A partition waiting on a healthy leader is done only once the high watermark passes its
    # offset (_status): the feed tries it on that advance, not on every one (OffsetIndex).
    indexed_by_high_watermark = True

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(self.appended)

    def high_watermark_needed(self, key: TopicPartitionKey) -> int | None:
        """``appended[key] + 1`` while ``key`` waits (the watermark must *pass* the offset); a
        read-back that brought nothing leaves it waiting, tried again on each later advance."""
        offset = self.appended.get(key)
        if offset is None or self.statuses.get(key) is not None:
            return None
        return offset + 1

    def try_complete(self) -> bool:
        # Hot path: the feed re-checks every operation watched on a key whose facts changed
        # (~100 per key in the benchmark); a one-partition produce still waiting on a healthy
        # partition is answered with two lookups and three comparisons.
        single = self._single
        if single is not None:
            key, offset, epoch = single
            facts = self.facts.partition(key)
            if facts is None or (
                facts.error is None
                and facts.leader_epoch == epoch
                and not facts.under_min_isr
                and (facts.high_watermark is None or facts.high_watermark <= offset)
            ):
                return False
        waiting = False
        for key, offset in self.appended.items():
            if self.statuses[key] is not None:
                continue
            facts = self.facts.partition(key)
            epoch = self.leader_epochs[key]
            if epoch is None:
                # A target without a known epoch: the first epoch seen is the reference.
                epoch = self.leader_epochs[key] = _epoch_of(facts)
                if single is not None and epoch is not None:
                    self._single = (key, offset, epoch)
            status = self._status(facts, offset, epoch)
            if status is ErrorCode.NONE and key in self.read_back:
                assert facts is not None and facts.high_watermark is not None, "NONE: it passed the offset"
                status = self._read_back(key, facts.high_watermark)
            if status is None:
                waiting = True
            else:
                self.statuses[key] = status
        return False if waiting else self.force_complete()

    @staticmethod
    def _status(facts: PartitionFacts | None, offset: int, epoch: int | None) -> ErrorCode | None:
        if facts is None:
            return None  # not polled yet
        if facts.error is not None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if facts.error.kind == "unknown_topic" else None
        if facts.leader_epoch is None or epoch is None:
            return None  # no epoch in this answer: the watermark cannot be vouched for
        if facts.leader_epoch != epoch:
            # Another leader: its high watermark is a position in its own log, which may lack
            # the record (the old leader died before a follower fetched it). (docstring)
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if facts.under_min_isr:
            # Kafka 4 (eligible leader replicas, KIP-966) holds the high watermark still while the
            # ISR is below min.insync.replicas: waiting could only time out. An acks=all produce
            # gets NOT_ENOUGH_REPLICAS from the leader in this state; so does this operation.
            return ErrorCode.NOT_ENOUGH_REPLICAS
        if facts.high_watermark is None or facts.high_watermark <= offset:
            return None
        return ErrorCode.NONE

    def _read_back(self, key: TopicPartitionKey, high: int) -> ErrorCode | None:
        """``NONE`` if the records appended to ``key`` (below the high watermark ``high``) are the
        ones at their offsets, ``NOT_LEADER_OR_FOLLOWER`` if another record is at one of them;
        None if one could not be read now.

        Runs in ``try_complete`` (small reads, once per partition: the verdict is final); the
        service hands an attempt made on its event loop's thread to an executor instead
        (``OffLoopProduce``). Each read asks for the records up to ``high`` (at most
        ``READ_BACK_MAX_BYTES``), not one: through a :class:`SharedReadReader` the produces
        completed by the same watermark then read theirs from memory, one Kafka read for all.
        """
        assert self.reader is not None, "read_back comes with its reader"
        for identity in self.read_back[key]:
            try:
                records = self.reader.read(
                    key, identity.offset, max(high, identity.offset + 1), max_bytes=READ_BACK_MAX_BYTES
                )
            except KafkaAdapterError:
                return None  # the next change of the facts tries again; expiry answers meanwhile
            if not records:
                # (Also an offset gone from the log — deleted, compacted: the partition waits
                # and expires, never vouched for.)
                return None
            if not identity.matches(records[0]):
                return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return self.appended

    def _respond(self) -> None:
        # An outage keeps REQUEST_TIMED_OUT here (with error KafkaUnavailableError): the HTTP
        # service's /replicated answers 504 for it, as it always did.
        undecided = ErrorCode.SHUTTING_DOWN if self.shutting_down else ErrorCode.REQUEST_TIMED_OUT
        for key, status in self.statuses.items():
            if status is None:
                self.statuses[key] = undecided

    @property
    def succeeded(self) -> bool:
        """True iff every partition ended ``NONE`` (replicated to every in-sync replica)."""
        return all(status is ErrorCode.NONE for status in self.statuses.values())

    def result(self) -> ReplicationResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        statuses = {key: status or ErrorCode.REQUEST_TIMED_OUT for key, status in self.statuses.items()}
        return ReplicationResult(outcome, dict(self.appended), statuses, self.error)


def _epoch_of(facts: PartitionFacts | None) -> int | None:
    return facts.leader_epoch if facts is not None and facts.error is None else None
