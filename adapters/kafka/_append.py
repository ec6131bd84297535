"""FencedAppender: an ``acks=1`` append that notes each partition's leader epoch *before* it.

Why: :class:`DelayedProduce` answers ``NONE`` once a partition's high watermark passes the
appended offset. With ``acks=1`` the leader may die before any follower fetched the record; a
follower still in the ISR becomes leader without it, later records reuse its offset, and the new
leader's watermark passes that offset — the record is gone, yet the watermark says replicated.
Kafka's broker has no such hole: a produce waiting in its purgatory fails with
``NOT_LEADER_OR_FOLLOWER`` when the partition's leader changes.

The produce response does not say which leader epoch appended the record (librdkafka reports
``leader_epoch()`` for consumed messages only), so the epoch known *before* the append stands in:
epochs never decrease, so ``E_before <= E_append <= E_seen`` for every later ListOffsets answer.
If a later answer's epoch equals ``E_before``, the leader did not change in between: the leader
that appended still leads, never truncated its log, and its high watermark counts the record.
If it differs, the record may be lost: the operation answers ``NOT_LEADER_OR_FOLLOWER``
(retriable; also when the leader changed cleanly, as on Kafka's broker).

What the epoch cannot see: a *deposed* leader that does not know it yet (a zombie: hung in a
long pause past the controller's session timeout, its successor elected meanwhile, and resumed
before the metadata saying so reached it) still appends what a producer with stale metadata sends
it, in its old epoch — after the feed may already have noted its successor's epoch, so
``E_before > E_append`` and the successor's watermark, of the same epoch as ``E_before``, passes
an offset its log holds another record at. (Also, a snapshot older than the append can note an
``E_before`` below ``E_append``.) So the append also returns the identities of the first and
the last record appended per partition (:class:`RecordIdentity`) and the reader to read them back
with: :class:`DelayedProduce` answers ``NONE`` only when they are the records at their offsets
below the high watermark (tests/kafka/test_replication.py, the zombie test).

Where ``E_before`` comes from: the change feed's snapshot (published before the append, so no
request at all while the partition is watched), else one ListOffsets(latest) for the partitions
the snapshot lacks. A record without a partition may land on any partition of its topic: every
partition's epoch is taken.

Concurrency contract: thread-safe (the producer and the view are; the snapshot is immutable).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ._clients import FetchedRecord, ProducerRecord, RecordIdentity, RecordProducer
from ._errors import KafkaUnavailableError
from ._facts import FactSource
from ._keys import TopicPartitionKey
from ._view import ClusterView

__all__ = ["Appended", "FencedAppender", "RecordReading"]

LEADER_BACKOFF_S = 0.1  # between asks of a partition whose leader does not answer yet


class RecordReading(Protocol):
    """Reads a range of a partition's records (:class:`RecordReader`, :class:`SharedReadReader`)."""

    def read(
        self, key: TopicPartitionKey, start: int, end: int, *, max_bytes: int
    ) -> list[FetchedRecord]: ...


@dataclass(frozen=True, slots=True)
class Appended:
    """Records a leader appended: the last offset per partition, and each partition's leader
    epoch as known before the append (see the module docstring).

    ``read_back`` (per partition, the identities of its first and last record appended) and
    ``reader`` are set by :class:`FencedAppender`: :class:`DelayedProduce` then reads those
    records back before answering ``NONE``. Without them (an ``Appended`` built from offsets and
    epochs alone) only the epoch fences: a deposed leader's append is not seen (module docstring).
    """

    offsets: Mapping[TopicPartitionKey, int]
    leader_epochs: Mapping[TopicPartitionKey, int]
    read_back: Mapping[TopicPartitionKey, tuple[RecordIdentity, ...]] = field(default_factory=dict)
    reader: RecordReading | None = None


class FencedAppender:
    """Appends with ``acks=1`` after noting the target partitions' leader epochs (see module doc)."""

    def __init__(
        self,
        producer: RecordProducer,
        facts: FactSource,
        view: ClusterView,
        reader: RecordReading | None = None,
    ) -> None:
        self.producer = producer
        self.facts = facts
        self.view = view
        # Reads the appended records back (DelayedProduce, module doc); None: the epoch alone.
        self.reader = reader

    def epochs_before(
        self, records: Iterable[ProducerRecord], deadline: float | None = None
    ) -> dict[TopicPartitionKey, int]:
        """The leader epoch of every partition ``records`` may be appended to, known now.

        A partition whose leader does not answer yet (NOT_LEADER_OR_FOLLOWER from the broker
        metadata names, moments after the topic was created or the leader moved; or a leader
        still loading, with no epoch) is asked again after a short backoff until ``deadline``
        (``time.monotonic()``), as the producer itself waits for a leader; then it raises.
        """
        targets: set[TopicPartitionKey] = set()
        for record in records:
            if record.partition is not None:
                targets.add(TopicPartitionKey(record.topic, record.partition))
            else:
                count = self.view.partition_count(record.topic)
                targets.update(TopicPartitionKey(record.topic, p) for p in range(count))
        epochs: dict[TopicPartitionKey, int] = {}
        for key in targets:
            facts = self.facts.partition(key)
            if facts is not None and facts.error is None and facts.leader_epoch is not None:
                epochs[key] = facts.leader_epoch
        missing = sorted(targets - epochs.keys(), key=lambda k: (k.topic, k.partition))
        while missing:
            try:
                epochs.update(self.view.leader_epochs(missing))
                break
            except KafkaUnavailableError:
                # No event tells when a leader starts answering: a bounded backoff, like
                # librdkafka's retry.backoff.ms for its own leader lookups.
                if deadline is None or time.monotonic() + LEADER_BACKOFF_S >= deadline:
                    raise
                time.sleep(LEADER_BACKOFF_S)
        return epochs

    def append(self, records: Iterable[ProducerRecord], timeout_s: float = 10.0) -> Appended:
        """Note the epochs, then append ``records``, all within about ``timeout_s``; raises as
        :meth:`RecordProducer.produce` (or :class:`KafkaUnavailableError` when time ran out)."""
        records = list(records)
        deadline = time.monotonic() + timeout_s
        epochs = self.epochs_before(records, deadline)
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaUnavailableError(
                f"no time left to append within {timeout_s:.1f} s after reading leader epochs"
            )
        offsets, identities = self.producer.produce_identified(records, timeout_s=left)
        return Appended(
            offsets,
            {k: epochs[k] for k in offsets if k in epochs},
            identities if self.reader is not None else {},
            self.reader,
        )
