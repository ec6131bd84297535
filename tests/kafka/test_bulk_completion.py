"""A key event completing many long polls at once (issue 12's fan-out): their hand-offs to the
event loop go in chunks, they share one read, and each waiter still hears exactly once — also
when expiries and departures race the event. No Kafka: the offset index's fake view, a record
cache fed as the tail feeds it, a purgatory on a MockTimer, the feed driven by ``poll_once``."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from typing import Any

import pytest
from purgatory.adapters.kafka import DelayedFetch, FetchedRecord, KafkaOperation
from purgatory.adapters.kafka.clients import _clients
from purgatory.adapters.kafka.facts._record_cache import SharedReadReader
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import Outcome
from purgatory._loop_handoff import BURST_CHUNK, handoff_for
from tests.core.test_loop_handoff import CountingLoop
from tests.kafka.test_offset_index import KEY, FakeView, _facts, feed_on_mock_timer

WAITERS = 1_000
AT = 5  # the long polls wait at the partition's end: one record appended there answers them


@pytest.fixture
def rig() -> Any:
    with feed_on_mock_timer("fetch", "bulk") as (view, feed, purgatory, timer):
        reader = SharedReadReader(KafkaSettings(), bootstrap_servers="127.0.0.1:1")  # served from memory only
        view.partitions[KEY] = _facts(AT)
        feed.poll_once()  # first facts: nothing to answer yet
        loop = CountingLoop()
        yield view, feed, purgatory, timer, reader, loop
        loop.close()


def _park(loop: asyncio.AbstractEventLoop, purgatory: Any, ops: list[DelayedFetch]) -> Counter[int]:
    """Each op waits with a task-free callback on ``loop`` (as the service's long polls); the
    counter says how often each op's callback ran, and holds the threads it ran on at 0."""
    heard: Counter[int] = Counter()

    def answered(op: DelayedFetch) -> None:
        heard[id(op)] += 1
        heard[threading.get_ident()] += 0  # the threads that called back (the loop's only)

    async def park() -> None:
        for op in ops:
            purgatory.watch_then_call(op, op.watch_keys(), answered)

    loop.run_until_complete(park())
    return heard


def _append_record(view: FakeView, reader: SharedReadReader) -> None:
    reader.append(KEY, [FetchedRecord(AT, b"k", b"v" * 100, 0)])  # the tail: records before facts
    view.partitions[KEY] = _facts(AT + 1)


def test_a_key_event_wakes_a_draining_loop_once_per_chunk_and_shares_one_read(rig: Any) -> None:
    """The window: the loop runs on another core and drains while the feed thread still completes
    the key's long polls, so every finish found the mailbox drained and woke the loop again
    (~3,400 wake-ups for 10,000). Made certain here: before each finish is handed over, the feed
    thread waits until the loop has run everything scheduled so far (each op's response callback)."""
    view, feed, purgatory, _, reader, loop = rig
    handoff = handoff_for(loop)
    ops: list[DelayedFetch] = []

    def loop_caught_up(_: KafkaOperation) -> None:
        caught_up = threading.Event()
        loop.call_soon_threadsafe(caught_up.set)  # runs after every drain scheduled before it
        assert caught_up.wait(10)

    ops += [
        DelayedFetch(feed, reader, {KEY: AT}, max_wait_ms=60_000, on_response=loop_caught_up)
        for _ in range(WAITERS)
    ]
    heard = _park(loop, purgatory, ops)
    drains: list[int] = []
    counted = loop.call_soon_threadsafe

    def count_drains(callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        if callback == handoff._drain:
            drains.append(1)
        return counted(callback, *args, context=context)

    loop.call_soon_threadsafe = count_drains  # type: ignore[method-assign]
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        _append_record(view, reader)
        feed.poll_once()  # this thread is the feed's
        finished = threading.Event()
        loop.call_soon_threadsafe(finished.set)
        assert finished.wait(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
    assert len(drains) <= -(-WAITERS // BURST_CHUNK), f"{len(drains)} wake-ups for {WAITERS} finishes"
    assert all(op.outcome is Outcome.COMPLETED for op in ops)
    assert sorted(n for n in heard.values() if n) == [1] * WAITERS, "every waiter answered exactly once"
    assert [t for t, n in heard.items() if n == 0] == [runner.ident], "called back on the loop's thread"
    records = {id(op.parts[0].records) for op in ops}
    assert len(records) == 1, "one records list shared by the key event's answers"
    assert [r.offset for r in ops[0].parts[0].records] == [AT]
    assert reader.repeated_reads == WAITERS - 1, "one read of the span, then the same answer again"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_waiter_hears_exactly_once_when_expiry_and_departures_race_the_key_event(
    rig: Any, seed: int
) -> None:
    """Three threads finish the same ops at once: the feed's key event (in bursts), the timer
    expiring the short ones, the waiters' connections going away (abandon). Whoever wins, each
    op has one outcome and its waiter hears once, on the loop, with nothing held in a burst."""
    view, feed, purgatory, timer, reader, loop = rig
    rng = random.Random(seed)
    ops = [
        DelayedFetch(feed, reader, {KEY: AT}, max_wait_ms=rng.choice((10, 60_000))) for _ in range(WAITERS)
    ]
    heard = _park(loop, purgatory, ops)
    leaving = rng.sample(ops, WAITERS // 4)
    _append_record(view, reader)
    start = threading.Barrier(3)

    def key_event() -> None:
        start.wait()
        feed.poll_once()

    def expire() -> None:
        start.wait()
        timer.advance_clock(20)

    def leave() -> None:
        start.wait()
        for op in leaving:
            purgatory.abandon(op)

    threads = [threading.Thread(target=t) for t in (key_event, expire, leave)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)

    async def settle() -> None:
        for _ in range(100):
            if sum(heard.values()) >= WAITERS:
                return
            await asyncio.sleep(0.01)

    loop.run_until_complete(settle())
    assert sorted(n for n in heard.values() if n) == [1] * WAITERS, "every waiter answered exactly once"
    assert [t for t, n in heard.items() if n == 0] == [threading.get_ident()], "on the loop's thread"
    outcomes = Counter(op.outcome for op in ops)
    assert None not in outcomes and sum(outcomes.values()) == WAITERS
    assert purgatory.watched() == 0 and feed.watched_keys() == frozenset(), "nothing left watched"


def test_mixed_positions_in_one_key_event_and_no_answer_waits_for_another_ones_kafka_read(
    rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long polls at the end (answered from the record cache) and one further back (its records
    are not cached: a Kafka read, up to its timeout on a stalled broker) complete in one key
    event; the ones finished before the read are handed to the loop before it starts."""
    view, feed, purgatory, _, reader, loop = rig
    handoff = handoff_for(loop)
    at_end = [DelayedFetch(feed, reader, {KEY: AT}, max_wait_ms=60_000) for _ in range(10)]
    behind = DelayedFetch(feed, reader, {KEY: 2}, max_wait_ms=60_000)
    heard = _park(loop, purgatory, [*at_end, behind])
    scheduled_at_read: list[bool] = []

    class Consumer:
        def assign(self, _: Any) -> None:
            pass

        def unassign(self) -> None:
            pass

    def consume_range(
        consumer: Any, key: Any, start: int, end: int, max_bytes: int, timeout_s: float
    ) -> tuple[list[FetchedRecord], bool]:
        scheduled_at_read.append(handoff._scheduled)  # the loop was woken for the earlier finishes
        return [FetchedRecord(o, None, b"old", 0) for o in range(start, end)], True

    monkeypatch.setattr(_clients, "_consume_range", consume_range)
    monkeypatch.setattr(_clients.RecordReader, "_get", lambda self: Consumer())
    _append_record(view, reader)
    feed_thread = threading.Thread(target=feed.poll_once)
    feed_thread.start()
    feed_thread.join(10)
    assert scheduled_at_read == [True], "the ten answers already finished went before the read"
    loop.run_until_complete(asyncio.sleep(0))
    assert sorted(n for n in heard.values() if n) == [1] * 11, "every waiter answered exactly once"
    assert [r.offset for r in behind.parts[0].records] == [2, 3, 4, 5]
    assert all([r.offset for r in op.parts[0].records] == [AT] for op in at_end)


def test_finishes_released_together_keep_the_key_watched_exactly_while_one_waits(rig: Any) -> None:
    """The feed releases what a key event finished in one step at its end (one lock, one count
    per key, not one per long poll): the key stays watched exactly while something waits on it,
    and a waiter finished meanwhile on another thread is released at once, as before."""
    view, feed, purgatory, timer, reader, loop = rig
    answered_now = [DelayedFetch(feed, reader, {KEY: AT}, max_wait_ms=60_000) for _ in range(WAITERS)]
    expiring = DelayedFetch(feed, reader, {KEY: AT}, max_wait_ms=10)
    staying = DelayedFetch(feed, reader, {KEY: AT + 1}, max_wait_ms=60_000)  # past the new record
    _park(loop, purgatory, [*answered_now, expiring, staying])
    assert feed.watched_keys() == {KEY}
    timer.advance_clock(10)  # finished on this thread, outside any key event: released at once
    assert expiring.outcome is Outcome.EXPIRED
    seen_inside: list[frozenset[Any]] = []
    answered_now[0].on_response = lambda _: seen_inside.append(feed.watched_keys())
    _append_record(view, reader)
    feed.poll_once()
    assert all(op.outcome is Outcome.COMPLETED for op in answered_now)
    assert seen_inside == [frozenset({KEY})], "released only once the key event ended"
    assert staying.outcome is None and feed.watched_keys() == {KEY}, "one waiter left: still watched"
    purgatory.abandon(staying)
    assert feed.watched_keys() == frozenset(), "the last waiter gone: the key is no longer watched"
