"""A key event's equal long polls share one answer (adapters/kafka/ops/_off_loop_fetch.py, module docstring).

No Kafka: the offset index tests' fake view, a record cache fed as the tail feeds it (reads never
reach a broker), a purgatory on a MockTimer, the feed driven by ``poll_once``, and the service's
own operation (``OffLoopFetch``) completed on the feed's thread as in the service.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from purgatory.adapters.kafka import ErrorCode, FetchedRecord
from purgatory.adapters.kafka.facts._record_cache import SharedReadReader
from purgatory.adapters.kafka.ops import _off_loop_fetch as _fetch
from purgatory.adapters.kafka.ops._off_loop_fetch import OffLoopFetch
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import Outcome
from tests.kafka.test_offset_index import KEY, _facts, feed_on_mock_timer

AT = 5
WAITERS = 200


@pytest.fixture
def rig() -> Any:
    with feed_on_mock_timer("fetch", "shared") as (view, feed, purgatory, timer):
        reader = SharedReadReader(KafkaSettings(), bootstrap_servers="127.0.0.1:1")  # memory only
        attempts = ThreadPoolExecutor(1)
        view.partitions[KEY] = _facts(AT)
        feed.poll_once()
        _fetch._last_answer = None  # another test's answer must not be taken here
        yield view, feed, purgatory, timer, reader, attempts
        attempts.shutdown()


def _fetches(
    rig: Any, n: int, offset: int = AT, *, waiting: bool = True, **kwargs: Any
) -> list[OffLoopFetch]:
    _, feed, purgatory, _, reader, attempts = rig
    ops = [
        OffLoopFetch(
            feed, reader, {KEY: offset}, max_wait_ms=60_000, loop_thread=-1, attempts=attempts, **kwargs
        )
        for _ in range(n)
    ]
    for op in ops:
        assert purgatory.try_complete_else_watch(op, op.watch_keys()) is not waiting
    return ops


def _append(rig: Any, *values: bytes) -> None:
    view, feed, _, _, reader, _ = rig
    high = view.partitions[KEY].high_watermark
    records = [FetchedRecord(high + i, b"k", value, 0) for i, value in enumerate(values)]
    reader.append(KEY, records)  # the tail: records before facts
    view.partitions[KEY] = _facts(high + len(values))
    feed.poll_once()


def test_equal_long_polls_of_one_key_event_take_the_first_ones_answer(rig: Any) -> None:
    equal = _fetches(rig, WAITERS)
    small = _fetches(rig, 3, max_bytes=150)  # other parameters: their own read
    two = _fetches(rig, 3, min_records=2)  # another count: their own checks and read
    _append(rig, b"a" * 100, b"b" * 100)
    for op in (*equal, *small, *two):
        assert op.outcome is Outcome.COMPLETED and op.error is None
        assert op.parts[0].status is ErrorCode.NONE
    assert [r.offset for r in equal[0].parts[0].records] == [AT, AT + 1]
    assert all(op.parts[0].records is equal[0].parts[0].records for op in equal), "one shared list"
    assert all(op.parts[0].read_from == AT + 2 and op.parts[0].bytes_read == 202 for op in equal)
    # max_bytes 150: the first record only (Kafka returns at least one), read by its own reads.
    assert all([r.offset for r in op.parts[0].records] == [AT] for op in small)
    assert all([r.offset for r in op.parts[0].records] == [AT, AT + 1] for op in two)
    assert not all(op.answered for op in small), "the first of them read for itself"
    assert sum(op.answered for op in equal) >= WAITERS - 1, "all but the first took its answer"


def test_a_later_key_event_is_answered_from_its_own_facts_not_the_last_answer(rig: Any) -> None:
    first = _fetches(rig, 5)
    _append(rig, b"one")
    assert all([r.value for r in op.parts[0].records] == [b"one"] for op in first)
    # Same offset, same parameters, but the partition moved on: a new facts object.
    again = _fetches(rig, 5, waiting=False)  # records at the offset: answered at once
    assert all([r.value for r in op.parts[0].records] == [b"one"] for op in again)
    at_end = _fetches(rig, 5, offset=AT + 1)
    _append(rig, b"two", b"three")
    both = _fetches(rig, 1, waiting=False)
    assert [r.value for r in both[0].parts[0].records] == [b"one", b"two", b"three"], "not the stale answer"
    assert all([r.value for r in op.parts[0].records] == [b"two", b"three"] for op in at_end)


def test_an_expired_long_poll_never_takes_the_last_answer(rig: Any) -> None:
    _, _, _, timer, _, _ = rig
    answered = _fetches(rig, 3)
    _append(rig, b"one")
    assert all(op.outcome is Outcome.COMPLETED for op in answered)
    waiting = _fetches(rig, 3, offset=AT + 1, max_bytes=1000)  # nothing there yet
    timer.advance_clock(60_000)
    for op in waiting:
        assert op.outcome is Outcome.EXPIRED and not op.answered
        assert op.parts[0].records == ()
