"""A parked long poll's operation is small: no instance dicts, one slotted record per partition.

The service holds up to 60,000 waiting long polls (admission.max_waiters); what each costs is
what the process needs (issue 12: <= 4 KB per waiter, transport and protocol included). Without
Kafka: fake facts, the real purgatory, the service's own operation class.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from purgatory.adapters.kafka import (
    DelayedFetch,
    ErrorCode,
    FactSource,
    FetchedRecord,
    PartitionFacts,
    RecordReader,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.facts import _keys
from purgatory.adapters.kafka.facts._keys import INTERNED_KEYS, partition_key
from purgatory.adapters.kafka.ops._off_loop_fetch import OffLoopFetch

from purgatory import DelayedOperationPurgatory, Outcome

KEY = TopicPartitionKey("orders", 0)
WAITERS = 2_000
# Measured 817 B per parked op with its waiter (tracemalloc); 2,489 B before the per-partition
# dicts, the instance dicts and the waiter closure went. The bound leaves room for allocator
# and version differences, and fails on any one of them coming back.
MAX_BYTES_PER_PARKED_OP = 1_100


class _Facts:
    """A FactSource that knows nothing yet (a partition not reported): every op keeps waiting."""

    unavailable: str | None = None

    def partition(self, key: TopicPartitionKey) -> PartitionFacts | None:
        return None


class _Reader:
    def __init__(self, records: list[FetchedRecord]) -> None:
        self.records = records

    def read(self, key: TopicPartitionKey, start: int, end: int, *, max_bytes: int) -> list[FetchedRecord]:
        return [r for r in self.records if start <= r.offset < end]


class _Waiter:
    def __init__(self) -> None:
        self.answered: list[DelayedFetch] = []

    def finished(self, op: DelayedFetch) -> None:
        self.answered.append(op)


def _parked_op(
    purgatory: DelayedOperationPurgatory[Any], attempts: ThreadPoolExecutor, waiter: _Waiter
) -> OffLoopFetch:
    op = OffLoopFetch(
        cast(FactSource, _Facts()),
        cast(RecordReader, _Reader([])),
        {KEY: 0},
        max_wait_ms=60_000,
        loop_thread=threading.get_ident(),
        attempts=attempts,
    )
    purgatory.watch_then_call(op, op.watch_keys(), waiter.finished)
    return op


async def test_a_parked_long_poll_operation_holds_no_instance_dict_and_under_1_1_kb() -> None:
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory(
        "fetch-memory", reaper_enabled=False
    )
    attempts = ThreadPoolExecutor(1)
    waiters = [_Waiter() for _ in range(WAITERS)]
    try:
        _parked_op(purgatory, attempts, _Waiter())  # first use: the loop's hand-off, the key's list
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            ops = [_parked_op(purgatory, attempts, waiters[i]) for i in range(WAITERS)]
            gc.collect()
            per_op = (tracemalloc.get_traced_memory()[0] - before) / WAITERS
        finally:
            tracemalloc.stop()
        assert not hasattr(ops[0], "__dict__"), "the service's fetch operation is slotted through its classes"
        assert per_op <= MAX_BYTES_PER_PARKED_OP, f"{per_op:.0f} B per parked op and its waiter"
        assert purgatory.num_delayed() == WAITERS + 1
    finally:
        purgatory.shutdown()
        attempts.shutdown()


def test_fetch_mappings_read_from_the_partition_records() -> None:
    other = TopicPartitionKey("orders", 1)
    records = [FetchedRecord(3, None, b"v", 0), FetchedRecord(4, None, b"w", 0)]
    op = DelayedFetch(
        cast(FactSource, _Facts()), cast(RecordReader, _Reader(records)), {KEY: 3, other: 7}, max_wait_ms=1
    )
    assert op.fetch_offsets == {KEY: 3, other: 7}
    assert op.statuses == {KEY: ErrorCode.NONE, other: ErrorCode.NONE}
    assert op.records == {KEY: [], other: []}
    assert [p.key for p in op.parts] == [KEY, other], "one PartitionRead per partition, in the order given"
    op.parts[0].add(records)
    assert op.records == {KEY: records, other: []}
    assert op.parts[0].read_from == 5 and op.parts[0].bytes_read == sum(r.size for r in records)
    op.records[KEY].clear()  # a copy: the op's own records stay
    assert op.records[KEY] == records


def test_an_expired_fetch_result_carries_its_records_and_statuses() -> None:
    record = FetchedRecord(0, None, b"v", 0)
    op = DelayedFetch(
        cast(FactSource, _Facts()), cast(RecordReader, _Reader([record])), {KEY: 0}, max_wait_ms=1
    )
    op.run()  # the timer's expiry: the unreported partition is read to its end
    result = op.result()
    assert result.outcome is Outcome.EXPIRED
    assert result.records == {KEY: [record]} and result.statuses == {KEY: ErrorCode.NONE}


def test_long_polls_on_one_partition_share_one_key_object() -> None:
    first = partition_key("orders", 0)
    second = partition_key("orders", 0)
    assert second is first, "the second waiter holds the first one's key (and its topic string)"
    assert partition_key("orders", 1) is not first


@pytest.mark.parametrize("held", [INTERNED_KEYS])
def test_interned_keys_are_bounded(held: int) -> None:
    for partition in range(held + 1):
        partition_key("orders", partition)
    assert len(_keys._INTERNED) <= held
