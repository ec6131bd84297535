"""One ListOffsets request's answers, collected in one wait: offsets, leader epochs, stale epochs.

:class:`ClusterView` (``_view``) sends ListOffsets for many partitions at once and overlaps it with
DescribeTopics; :class:`_PendingOffsets` holds the per-partition futures until the view collects
them, turning each into a :class:`ListedOffset` or an :class:`ErrorFact`, and tells the view when
an answer says its cached leader epoch is stale.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from ..clients._errors import KafkaUnavailableError
from ._facts import (
    ErrorFact,
    _code,
    _error_fact,
)
from ._keys import TopicPartitionKey

__all__ = ["ListedOffset"]


# ListOffsets answers saying the client's cached leader epoch is stale (ClusterView._forget_leader_epochs).
_STALE_EPOCH_CODES = frozenset({KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH})


@dataclass(frozen=True, slots=True)
class ListedOffset:
    """One partition's answer to ListOffsets: the offset and the epoch of the leader that answered."""

    offset: int
    leader_epoch: int | None


class _PendingOffsets:
    """The per-partition futures of one ListOffsets request, collected in one wait."""

    __slots__ = ("_futures", "_on_stale_epoch", "_timeout_s", "_what")

    def __init__(
        self,
        futures: Mapping[TopicPartition, Future[Any]],
        what: str,
        timeout_s: float,
        on_stale_epoch: Callable[[], None],
    ) -> None:
        self._on_stale_epoch = on_stale_epoch
        self._futures = futures
        self._what = what
        self._timeout_s = timeout_s

    def collect(self) -> dict[TopicPartitionKey, ListedOffset | ErrorFact]:
        """Offsets (or per-partition errors); :class:`KafkaUnavailableError` if the answer is late."""
        _done, late = wait(self._futures.values(), timeout=self._timeout_s)
        if late:
            raise KafkaUnavailableError(f"Kafka did not answer {self._what} within {self._timeout_s:.1f} s")
        stale = False
        out: dict[TopicPartitionKey, ListedOffset | ErrorFact] = {}
        for tp, future in self._futures.items():
            key = TopicPartitionKey(tp.topic, tp.partition)
            try:
                info = future.result()
                # librdkafka says -1 (or None) when the broker sent no epoch.
                epoch = int(info.leader_epoch) if info.leader_epoch is not None else -1
                out[key] = ListedOffset(int(info.offset), epoch if epoch >= 0 else None)
            except KafkaException as exc:
                out[key] = _error_fact(exc, f"partition {key.label}", key.topic, key.partition)
                stale |= _code(exc) in _STALE_EPOCH_CODES
        if stale:
            self._on_stale_epoch()
        return out
