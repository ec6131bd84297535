"""Committed offsets of consumer groups, read by one non-joining consumer per group.

Why a consumer per group and not the admin client's ListConsumerGroupOffsets: see ``_view.py``'s
module docstring (librdkafka #4605). :class:`ClusterView` asks :class:`_CommittedOffsetReaders`
for the groups of each poll; the answers are turned into ``GroupFacts`` there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ..clients._errors import KafkaUnavailableError
from ._facts import _code, _unavailable_or

__all__ = ["COORDINATOR_RETRY_BACKOFF_S", "GROUP_READER_THREADS"]

# Groups asked in parallel: each Consumer.committed call blocks a thread for up to the request
# timeout, so a poll over more groups than this takes more than one round trip.
GROUP_READER_THREADS = 8
# A consumer's OffsetFetch answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS while it is
# still finding the group's coordinator (a new reader, a moved coordinator); the admin request it
# replaces retried these within its timeout, so the reader does too, after this pause.
COORDINATOR_RETRY_BACKOFF_S = 0.05
_COORDINATOR_RETRY_CODES = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


class _GroupReader:
    """A consumer that reads one group's committed offsets; its lock keeps ``close`` off a call."""

    __slots__ = ("_closed", "_consumer", "_lock")

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._lock = threading.Lock()
        self._closed = False

    def committed(self, partitions: list[TopicPartition], timeout_s: float) -> list[TopicPartition]:
        """One OffsetFetch, repeated on retriable coordinator errors until ``timeout_s`` is spent."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                if self._closed:
                    # Closed between submission and run (the group was unwatched, or a reconnect).
                    raise KafkaUnavailableError("the group's offset reader was closed (reconnecting)")
                left = deadline - time.monotonic()
                try:
                    return list(self._consumer.committed(partitions, timeout=max(left, 0.001)))
                except KafkaException as exc:
                    if _code(exc) not in _COORDINATOR_RETRY_CODES or left <= COORDINATOR_RETRY_BACKOFF_S:
                        raise
                time.sleep(COORDINATOR_RETRY_BACKOFF_S)  # let the client look the coordinator up again

    def close(self) -> None:
        with self._lock:  # waits for a call in flight (bounded by the request timeout)
            if not self._closed:
                self._closed = True
                self._consumer.close()


class _CommittedOffsetReaders:
    """One non-joining :class:`Consumer` per group, asked for committed offsets (OffsetFetch).

    Algorithm: ``committed(group, partitions)`` gets (or lazily creates) the group's consumer
    — ``group.id`` is the group, it never subscribes, so it never joins the group nor commits —
    and runs ``Consumer.committed`` (one OffsetFetch for all the partitions) on a small thread
    pool, so the groups of one poll are asked in parallel and overlap the admin requests.
    ``retain(groups)`` closes the consumers of every other group; ``shutdown`` closes them all.
    Closing runs on the pool too: a consumer's close may wait on its coordinator (a frozen
    broker), which must not hold up the caller — the change feed's thread.

    Why not ``AdminClient.list_consumer_group_offsets``: see the module docstring (#4605).

    Concurrency contract: thread-safe. The reader map is guarded by a lock; each reader's own
    lock orders a call in flight before its close.
    """

    def __init__(
        self, config: Callable[[str], dict[str, str | int | float | bool]], timeout_s: float
    ) -> None:
        self._config = config  # group -> librdkafka config, built on demand (secrets never stored here)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._readers: dict[str, _GroupReader] = {}
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        # Caller holds self._lock.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(GROUP_READER_THREADS, thread_name_prefix="kafka-group-offsets")
        return self._pool

    def committed(self, group: str, partitions: list[TopicPartition]) -> Future[list[TopicPartition]]:
        """The future committed offsets of ``partitions`` for ``group`` (``KafkaException`` on error)."""
        with self._lock:
            reader = self._readers.get(group)
            if reader is None:
                try:
                    reader = _GroupReader(Consumer(self._config(group)))
                except KafkaException as exc:
                    raise _unavailable_or(exc, f"consumer for group {group!r}") from None
                self._readers[group] = reader
            return self._executor().submit(reader.committed, partitions, self._timeout_s)

    @property
    def groups(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._readers)

    def retain(self, groups: Iterable[str]) -> None:
        """Close (in the background) the readers of every group not in ``groups``."""
        keep = set(groups)
        with self._lock:
            gone = [self._readers.pop(g) for g in list(self._readers) if g not in keep]
            if gone:
                pool = self._executor()
                for reader in gone:
                    pool.submit(reader.close)

    def shutdown(self) -> None:
        """Close every reader and let the pool's threads end once their work is done."""
        self.retain(())
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
