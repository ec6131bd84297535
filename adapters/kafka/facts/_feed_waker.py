"""The change feed's waker: a key whose facts changed wakes the purgatories watching it.

The third of the feed's jobs (the others: the key registry, ``_feed_keys``; the poll thread,
``_feed``). A changed key costs ``check_and_complete(key)`` in each purgatory watching it — except
an advance of a partition's high watermark in a purgatory whose every watcher of it is indexed
(:class:`OffsetIndex`, ``KafkaOperation.indexed_by_high_watermark``): then only the operations it
reached are tried. The tail's pushes (``_pushed``, on the tail's thread) publish high watermarks
and wake the same way as the poll's changes.
"""

from __future__ import annotations

import dataclasses
import threading

import structlog

from purgatory._loop_handoff import handoff_burst

from ..clients._clients import FetchedRecord
from ._feed_keys import _IndexedOp, _KeyRegistry
from ._feed_state import FeedStats, Purgatoryish, RecordSink, _Snapshot
from ._keys import KafkaKey, TopicPartitionKey
from ._offset_index import AT, OP
from ._tail import TailedPosition

__all__: list[str] = []

_log = structlog.get_logger("purgatory.kafka.feed")


class _Waker(_KeyRegistry):
    """Wakes changed keys in the purgatories watching them (a base of :class:`ChangeFeed`, as
    :class:`_KeyRegistry` is: it reads the registry's counts under the registry's lock)."""

    name: str
    stats: FeedStats
    _snapshot: _Snapshot
    # Both the poll loop and the tail publish snapshots (ChangeFeed.__init__).
    _publish_lock: threading.Lock
    _metadata_suspect: bool
    _records: RecordSink | None

    def _check(self, key: KafkaKey, advanced_to: int | None = None) -> None:
        """Wake ``key`` in every purgatory watching it. ``advanced_to``: only its high watermark
        moved, to this: purgatories whose every watcher of ``key`` is indexed try just the due
        ones (OffsetIndex); the others, and every other change, ``check_and_complete(key)``."""
        advance = advanced_to is not None and isinstance(key, TopicPartitionKey)
        with self._lock:
            # (purgatory, whether every one of its watchers of key is indexed), one read of both
            # counts under the lock that updates them together.
            woken = [
                (self._purgatories[name], advance and self._indexed.get((name, key), 0) >= count)  # type: ignore[arg-type]
                for name, count in self._refs.get(key, {}).items()
                if name in self._purgatories
            ]
        # One burst: the loops awaiting what this key event finishes are woken every
        # BURST_CHUNK finishes, not once per finish (purgatory/_loop_handoff.py, "Bursts").
        local = self._finishing
        outer = getattr(local, "ops", None) is not None
        if not outer:
            local.ops = []
        try:
            with handoff_burst():
                self._wake_all(key, advanced_to, woken)
        finally:
            if not outer:
                finished, local.ops = local.ops, None
                if finished:
                    self._release_finished(finished)

    def _wake_all(
        self, key: KafkaKey, advanced_to: int | None, woken: list[tuple[Purgatoryish, bool]]
    ) -> None:
        for purgatory, covered in woken:
            if covered:
                assert isinstance(key, TopicPartitionKey) and advanced_to is not None, "covered: an advance"
                self._wake_indexed(purgatory, key, advanced_to)
                continue
            self.stats.checks += 1
            try:
                purgatory.check_and_complete(key)
            except Exception:
                _log.exception(
                    "kafka_feed_check_failed", feed=self.name, key=str(key), purgatory=purgatory.name
                )

    def _wake_indexed(self, purgatory: Purgatoryish, key: TopicPartitionKey, high_watermark: int) -> None:
        """Try the operations of ``purgatory`` whose needed high watermark of ``key`` was reached.

        As ``check_and_complete`` does for each op: ``safe_try_complete`` under its lock, a
        failure logged and counted with the op left watched and timed (and indexed). An op still
        waiting is put back at what it needs now. Popped entries are out of the heap while they
        are tried, so an advance published meanwhile by the other thread (tail vs poll) may have
        missed them: pass again while the published watermark moved past the one handled.
        """
        self.stats.indexed_wakes += 1
        name = purgatory.name
        handled = high_watermark
        while True:
            for entry in self.index.due(name, key, handled):
                op: _IndexedOp | None = entry[OP]
                if op is None:
                    continue  # finished or released since the pop
                self.stats.indexed_tries += 1
                at: int | None = entry[AT]
                try:
                    op.safe_try_complete()
                    if op.is_completed():
                        continue
                    at = op.high_watermark_needed(key)
                except Exception as exc:
                    # Stays watched, timed and indexed where it was: tried again on every later
                    # advance, as check_and_complete would (and the other due ops still are).
                    _user_code_failed(purgatory, op, exc)
                if at is not None:
                    self.index.again(name, key, entry, at)
            facts = self._snapshot.partitions.get(key)
            latest = None if facts is None else facts.high_watermark
            if latest is None or latest <= handled:
                return
            handled = latest

    def _tailed_records(self, key: TopicPartitionKey, records: list[FetchedRecord]) -> None:
        if self._records is not None:
            self._records.append(key, records)  # before the facts: a woken fetch reads them from memory

    def _pushed(self, positions: dict[TopicPartitionKey, TailedPosition]) -> None:
        """Publish the high watermarks the tail vouches for, then wake the keys that moved.

        A position whose records a newer leader appended than the facts' leader epoch says is not
        published (PartitionTail's module doc): the facts' epoch and high watermark must come from
        one leader, or DelayedReplication could count another leader's records at its offset. The
        poll is woken instead and re-describes the partition; its ListOffsets answer brings the
        new leader's epoch.
        """
        changed: list[tuple[TopicPartitionKey, int]] = []
        newer_leader = False
        with self._publish_lock:
            old = self._snapshot
            partitions = dict(old.partitions)  # copy-on-write: readers keep the snapshot they hold
            for key, position in positions.items():
                facts = partitions.get(key)
                # Leader, ISR and min ISR come from a poll first (DelayedReplication reads them); a
                # partition in error waits for the poll that says it recovered.
                if facts is None or facts.error is not None:
                    continue
                if (
                    position.leader_epoch is None
                    or facts.leader_epoch is None
                    or position.leader_epoch > facts.leader_epoch
                ):
                    newer_leader = True
                    continue
                if facts.high_watermark is None or position.read_to > facts.high_watermark:
                    partitions[key] = dataclasses.replace(facts, high_watermark=position.read_to)
                    changed.append((key, position.read_to))
            if changed:
                self._snapshot = _Snapshot(partitions, old.topics, old.groups, old.unavailable)
        if newer_leader:
            self.stats.pushes_withheld += 1
            self._metadata_suspect = True
            self._wake.set()
        self.stats.keys_changed += len(changed)
        for observer in self._observers:
            observer([key for key, _ in changed])
        for key, read_to in changed:
            self._check(key, read_to)  # only the high watermark moved (replaced above)

    def _tail_lost(self, key: TopicPartitionKey, why: str) -> None:
        _log.info("kafka_feed_partition_untailed", feed=self.name, partition=key.label, error=why)
        self._wake.set()  # poll now: the poll says what happened to it (deleted, moved)


def _user_code_failed(purgatory: Purgatoryish, op: _IndexedOp, exc: Exception) -> None:
    # As check_and_complete: logged and counted by the purgatory (a fake of tests may not count).
    report = getattr(purgatory, "user_code_failed", None)
    if callable(report):
        report(op, "try_complete", exc)
    else:
        _log.error("kafka_feed_try_failed", purgatory=purgatory.name, exc_info=exc)
