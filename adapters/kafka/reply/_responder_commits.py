"""The responder's commit bookkeeping: which consumed requests may be committed, and when.

A request's offset is committed only once Kafka acknowledged every reply sent before it: the
loop takes a :class:`_Checkpoint` of its positions and the replies sent so far, and
:class:`_ReplyAcks` (fed by the producer's delivery reports, on librdkafka's thread) says when
the replies below it are all acknowledged. :class:`_CommitState` is what the loop consumed since
its last commit. Only :class:`Responder`'s loop (``_responder``) uses them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from confluent_kafka import TopicPartition

__all__ = []


class _CommitState:
    """What the loop consumed since its last commit (the responder thread's own)."""

    def __init__(self) -> None:
        self.dirty = False
        self.since = 0.0  # when the oldest uncommitted request was read
        self.last_commit = 0.0  # when the loop last committed (or tried to)
        self.undelivered = 0
        self.checkpoint: _Checkpoint | None = None

    def touch(self) -> None:
        if not self.dirty:
            self.dirty = True
            self.since = time.monotonic()

    def reset(self) -> None:
        self.dirty = False
        self.undelivered = 0
        self.checkpoint = None


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    """Positions to commit once the replies sent before them (``replies``) are all acknowledged."""

    replies: int
    positions: list[TopicPartition]
    taken: float


class _ReplyAcks:
    """Which replies Kafka reported, as a prefix of their send order.

    ``next`` numbers a reply on the responder thread; ``reported`` runs on the sender thread when
    librdkafka reports it (in order within a reply partition, in any order across them);
    ``reported_below(n)`` is True once every reply numbered below ``n`` was reported. The set
    holds only the reports ahead of a gap (a few batches of another partition).
    """

    __slots__ = ("_ahead", "_lock", "_prefix", "sent")

    def __init__(self) -> None:
        self.sent = 0  # replies numbered so far (responder thread only)
        self._prefix = 0  # every reply below this was reported
        self._ahead: set[int] = set()
        self._lock = threading.Lock()

    def next(self) -> int:
        seq = self.sent
        self.sent += 1
        return seq

    def reported(self, seq: int) -> None:
        with self._lock:
            if seq != self._prefix:
                self._ahead.add(seq)
                return
            prefix, ahead = seq + 1, self._ahead
            while prefix in ahead:
                ahead.discard(prefix)
                prefix += 1
            self._prefix = prefix

    def reported_below(self, count: int) -> bool:
        with self._lock:
            return self._prefix >= count
