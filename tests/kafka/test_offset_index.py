"""The change feed's offset index: a high-watermark advance tries only the operations it can
complete (issue 12: a key event costs O(operations it completes)). No Kafka: a fake cluster view
whose facts the test sets, and a purgatory on a MockTimer; the feed is driven by calling
``poll_once`` (and the tail's callback) on the test's thread."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from purgatory.adapters.kafka import (
    Appended,
    ChangeFeed,
    DelayedFetch,
    DelayedReplication,
    ErrorCode,
    FetchedRecord,
    PartitionFacts,
    RecordIdentity,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.facts._facts import ClusterFacts
from purgatory.adapters.kafka.facts._offset_index import COMPACT_MIN, OffsetIndex
from purgatory.adapters.kafka.facts._tail import TailedPosition
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import DelayedOperationPurgatory, MockTimer, Outcome

KEY = TopicPartitionKey("orders", 0)
OTHER = TopicPartitionKey("orders", 1)
EPOCH = 3


def _facts(high: int | None, epoch: int = EPOCH, isr: tuple[int, ...] = (1, 2, 3)) -> PartitionFacts:
    return PartitionFacts(high_watermark=high, leader=1, leader_epoch=epoch, isr=isr, min_insync_replicas=2)


class FakeView:
    """A ClusterView whose answers the test sets (no cluster: the feed polls, no tail)."""

    request_timeout_s = 1.0

    def __init__(self) -> None:
        self.partitions: dict[TopicPartitionKey, PartitionFacts] = {}

    def facts(self, parts: Sequence[TopicPartitionKey], *_: Any, **__: Any) -> ClusterFacts:
        return ClusterFacts(partitions={k: self.partitions[k] for k in parts if k in self.partitions})

    def retain_groups(self, groups: Any) -> None:
        pass

    def reconnect(self) -> None:
        pass


class CountingProduce(DelayedReplication):
    """A DelayedReplication that counts its completion attempts (the cost of a key event)."""

    tries = 0

    def try_complete(self) -> bool:
        CountingProduce.tries += 1
        return super().try_complete()


@contextmanager
def feed_on_mock_timer(kind: str, name: str) -> Iterator[tuple[FakeView, ChangeFeed, Any, MockTimer]]:
    """A change feed over a :class:`FakeView`, attached to a ``kind`` purgatory on a MockTimer
    (no reaper: only the test moves time); detached and shut down on exit. Shared by the feed's
    rigs here, in test_bulk_completion and in tests/service/test_poll_groups."""
    view = FakeView()
    feed = ChangeFeed(view, settings=KafkaSettings(), name=name)  # type: ignore[arg-type]
    timer = MockTimer()
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory(
        kind, timer=timer, reaper_enabled=False
    )
    feed.attach(purgatory)
    try:
        yield view, feed, purgatory, timer
    finally:
        feed.detach(purgatory)
        purgatory.shutdown()


@pytest.fixture
def rig() -> Any:
    with feed_on_mock_timer("produce", "idx") as rigged:
        CountingProduce.tries = 0
        yield rigged


def _submit(
    feed: ChangeFeed, purgatory: Any, offsets: range, key: TopicPartitionKey = KEY
) -> list[DelayedReplication]:
    ops = []
    for offset in offsets:
        op = CountingProduce(feed, Appended({key: offset}, {key: EPOCH}), delay_ms=60_000)
        purgatory.try_complete_else_watch(op, op.watch_keys())
        ops.append(op)
    return ops


def test_high_watermark_advance_tries_only_the_operations_it_completes(rig: Any) -> None:
    view, feed, purgatory, _ = rig
    ops = _submit(feed, purgatory, range(100))
    view.partitions[KEY] = _facts(0)
    feed.poll_once()  # first facts of the key: a full check (nothing to complete yet)
    CountingProduce.tries = 0
    view.partitions[KEY] = _facts(10)
    feed.poll_once()
    done = [op for op in ops if op.is_completed()]
    assert done == ops[:10], "the advance to 10 completes exactly the produces at offsets 0..9"
    assert all(op.statuses == {KEY: ErrorCode.NONE} for op in done)
    assert CountingProduce.tries == 10, (
        f"an advance must try only the operations it completes, not all 100 waiting: {CountingProduce.tries}"
    )
    assert feed.stats.indexed_tries == 10


def test_the_tails_push_tries_only_the_operations_it_completes(rig: Any) -> None:
    view, feed, purgatory, _ = rig
    ops = _submit(feed, purgatory, range(50))
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    CountingProduce.tries = 0
    feed._pushed({KEY: TailedPosition(read_to=3, leader_epoch=EPOCH)})
    assert [op.is_completed() for op in ops[:4]] == [True, True, True, False]
    assert CountingProduce.tries == 3


def test_a_leader_change_still_answers_every_waiting_produce(rig: Any) -> None:
    view, feed, purgatory, _ = rig
    ops = _submit(feed, purgatory, range(20))
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    view.partitions[KEY] = _facts(5, epoch=EPOCH + 1)  # another leader: not a high-watermark-only change
    feed.poll_once()
    assert all(op.is_completed() for op in ops), "a leader change is checked on every operation of the key"
    assert {op.statuses[KEY] for op in ops} == {ErrorCode.NOT_LEADER_OR_FOLLOWER}


def test_an_isr_below_min_insync_answers_not_enough_replicas_to_all(rig: Any) -> None:
    view, feed, purgatory, _ = rig
    ops = _submit(feed, purgatory, range(5))
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    view.partitions[KEY] = _facts(1, isr=(1,))  # the watermark moved *and* the ISR shrank
    feed.poll_once()
    assert [op.statuses[KEY] for op in ops] == [ErrorCode.NOT_ENOUGH_REPLICAS] * 5, "ISR change: all answered"


def test_a_purgatory_holding_other_operations_on_the_key_is_checked_in_full(rig: Any) -> None:
    view, feed, purgatory, _ = rig
    ops = _submit(feed, purgatory, range(10))
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    fetch = DelayedFetch(feed, _NoReader(), {KEY: 0}, min_records=4, max_wait_ms=60_000)
    purgatory.try_complete_else_watch(fetch, fetch.watch_keys())
    CountingProduce.tries = 0
    view.partitions[KEY] = _facts(4)
    feed.poll_once()
    assert fetch.is_completed(), "a fetch on the same key in the same purgatory is woken by the advance"
    assert [op.is_completed() for op in ops] == [True] * 4 + [False] * 6
    assert CountingProduce.tries == 10, "not every watcher is indexed: check_and_complete tries them all"


def test_finished_operations_leave_the_index(rig: Any) -> None:
    view, feed, purgatory, timer = rig
    _submit(feed, purgatory, range(1000, 1000 + 4 * COMPACT_MIN))
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    assert feed.index.size("produce", KEY) == 4 * COMPACT_MIN
    timer.advance_clock(60_000)  # every produce expires before its offset is reached
    assert feed.index.keys() == 0, "expired operations must not stay indexed"
    view.partitions[KEY] = _facts(2000)
    feed.poll_once()
    assert CountingProduce.tries == 4 * COMPACT_MIN * 3, "expired operations are never tried again"


class _StubTail:
    """Stands for the tail so the poll merges pushed watermarks; the test pushes by hand."""

    def following(self, key: TopicPartitionKey) -> bool:
        return True

    def follow(self, keys: Any) -> None:
        pass

    def stop(self) -> None:
        pass


class _NoReader:
    """A record reader with nothing to give (a stalled broker), then the records once told."""

    def __init__(self) -> None:
        self.records: dict[int, FetchedRecord] = {}

    def read(
        self, key: TopicPartitionKey, start: int, end: int, *, max_bytes: int = 0
    ) -> list[FetchedRecord]:
        return [self.records[o] for o in range(start, end) if o in self.records]


def test_a_read_back_that_brought_nothing_is_tried_again_on_the_next_advance(rig: Any) -> None:
    view, feed, purgatory, _ = rig
    reader = _NoReader()
    record = FetchedRecord(0, b"k", b"v", 17, ())
    identity = RecordIdentity.of(0, b"k", b"v", 17)
    op = DelayedReplication(
        feed, Appended({KEY: 0}, {KEY: EPOCH}, {KEY: (identity,)}, reader), delay_ms=60_000
    )
    purgatory.try_complete_else_watch(op, op.watch_keys())
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    view.partitions[KEY] = _facts(1)
    feed.poll_once()
    assert not op.is_completed(), "the record could not be read back: still waiting"
    assert feed.stats.indexed_tries == 1
    reader.records[0] = record
    view.partitions[KEY] = _facts(2)
    feed.poll_once()
    assert op.is_completed() and op.statuses == {KEY: ErrorCode.NONE}


class FlakyProduce(DelayedReplication):
    """Raises on its first attempt after submission (user code failing inside a key event)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raise_next = False

    def try_complete(self) -> bool:
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("boom")
        return super().try_complete()


def test_an_operation_raising_in_an_indexed_wake_is_counted_and_tried_again(rig: Any) -> None:
    view, feed, purgatory, _ = rig
    ops = [FlakyProduce(feed, Appended({KEY: o}, {KEY: EPOCH}), delay_ms=60_000) for o in range(3)]
    for op in ops:
        purgatory.try_complete_else_watch(op, op.watch_keys())
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    ops[0].raise_next = True
    errors = purgatory.stats.user_code_errors
    view.partitions[KEY] = _facts(2)
    feed.poll_once()
    assert not ops[0].is_completed() and ops[1].is_completed(), "one op's failure does not starve the others"
    assert purgatory.stats.user_code_errors == errors + 1, "the failure is counted by the purgatory"
    view.partitions[KEY] = _facts(3)
    feed.poll_once()
    assert ops[0].is_completed() and ops[2].is_completed(), "the failed op stayed indexed and is tried again"


def test_index_pops_in_offset_order_and_skips_dead_entries() -> None:
    index = OffsetIndex()
    entries = {at: index.add("p", KEY, at, f"op{at}") for at in (9, 3, 7, 12)}
    index.kill("p", KEY, entries[7])
    due = index.due("p", KEY, 9)
    assert [e[2] for e in due] == ["op3", "op9"], "due entries in offset order, the dead one skipped"
    index.again("p", KEY, due[1], 11)
    assert [e[2] for e in index.due("p", KEY, 11)] == ["op9"]
    assert index.size("p", KEY) == 1
    index.kill("p", KEY, due[0])  # popped and not put back: killing it touches no heap
    assert [e[2] for e in index.due("p", KEY, 12)] == ["op12"]
    assert index.keys() == 0


def test_concurrent_advances_and_submissions_complete_every_produce_exactly_once(rig: Any) -> None:
    """Attacks the window where an entry is popped by one event and out of the heap while another
    event (the tail's push vs the poll) publishes a higher watermark, and the window between a
    submission's indexing and its first try: every produce whose offset the final watermark
    passed must finish, each once."""
    view, feed, purgatory, _ = rig
    feed.tail = _StubTail()  # the poll keeps a higher pushed watermark (_newest), as with a tail
    first = DelayedReplication(feed, Appended({KEY: 10**9}, {KEY: EPOCH}), delay_ms=600_000)
    purgatory.try_complete_else_watch(first, first.watch_keys())  # the key is watched, facts known
    view.partitions[KEY] = _facts(0)
    feed.poll_once()
    finished: list[DelayedReplication] = []
    lock = threading.Lock()

    def respond(op: Any) -> None:
        with lock:
            finished.append(op)

    ops: list[DelayedReplication] = []
    top = 3000
    stop = threading.Event()

    def submit() -> None:
        for offset in range(top):
            op = DelayedReplication(
                feed, Appended({KEY: offset}, {KEY: EPOCH}), delay_ms=600_000, on_response=respond
            )
            ops.append(op)
            purgatory.try_complete_else_watch(op, op.watch_keys())

    def push() -> None:
        rnd = random.Random(1)
        high = 0
        while not stop.is_set() and high < top:
            high += rnd.randint(1, 7)
            feed._pushed({KEY: TailedPosition(read_to=min(high, top), leader_epoch=EPOCH)})

    def poll() -> None:
        rnd = random.Random(2)
        high = 0
        while not stop.is_set() and high < top:
            high += rnd.randint(1, 9)
            view.partitions[KEY] = _facts(min(high, top))
            feed.poll_once()

    threads = [threading.Thread(target=f) for f in (submit, push, poll)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stop.set()
    assert not any(thread.is_alive() for thread in threads)
    assert len(ops) == top
    published = feed.partition(KEY)
    assert published is not None and published.high_watermark == top
    missing = [op.appended[KEY] for op in ops if not op.is_completed()]
    assert not missing, f"produces below the final watermark {top} left waiting: {missing[:10]}"
    assert len(finished) == top and len({id(op) for op in finished}) == top, "each finished exactly once"
    assert all(op.outcome is Outcome.COMPLETED and op.statuses[KEY] is ErrorCode.NONE for op in ops)
