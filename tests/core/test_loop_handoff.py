"""LoopHandoff: outcomes finished off the loop arrive in batches, one wake-up each."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from purgatory import DelayedOperationPurgatory, Outcome
from purgatory._loop_handoff import BURST_CHUNK, LoopHandoff, handoff_burst, handoff_for, release_burst

from .ops import MockDelayedOperation


class CountingLoop(asyncio.SelectorEventLoop):
    """Counts the thread-safe wake-ups asked of it."""

    threadsafe_calls = 0

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


def _complete_on_another_thread(
    purgatory: DelayedOperationPurgatory[MockDelayedOperation], ops: list[MockDelayedOperation], key: str
) -> None:
    """Makes every op completable and completes them all with one key event on a thread of its own,
    joined here: called on the loop, it blocks it on purpose, so every finish lands before it runs again."""

    completed: list[int] = []

    def complete_all() -> None:
        for op in ops:
            op.completable = True
        completed.append(purgatory.check_and_complete(key))

    finisher = threading.Thread(target=complete_all)
    finisher.start()
    finisher.join()
    assert completed == [len(ops)], "one key event completes every op"


def test_a_burst_of_outcomes_from_another_thread_costs_one_wake_up() -> None:
    loop = CountingLoop()
    try:
        futures = [loop.create_future() for _ in range(1000)]
        handoff = LoopHandoff(loop)
        poster = threading.Thread(target=lambda: [handoff.post(f, i) for i, f in enumerate(futures)])
        poster.start()
        poster.join()  # every post lands before the loop runs once
        assert loop.threadsafe_calls == 1, "one drain scheduled for the whole burst"
        loop.run_until_complete(asyncio.sleep(0))
        assert [f.result() for f in futures] == list(range(1000))
    finally:
        loop.close()


def test_a_post_after_a_drain_schedules_the_next_one() -> None:
    loop = CountingLoop()
    try:
        handoff = LoopHandoff(loop)
        first, second = loop.create_future(), loop.create_future()
        handoff.post(first, "a")
        loop.run_until_complete(first)
        handoff.post(second, "b")  # the first drain ran: this post must not wait for nothing
        assert loop.run_until_complete(asyncio.wait_for(second, 5)) == "b"
        assert loop.threadsafe_calls == 2
    finally:
        loop.close()


def test_a_cancelled_future_is_left_alone() -> None:
    loop = asyncio.new_event_loop()
    try:
        handoff = LoopHandoff(loop)
        cancelled, kept = loop.create_future(), loop.create_future()
        cancelled.cancel()
        handoff.post(cancelled, 1)
        handoff.post(kept, 2)
        assert loop.run_until_complete(kept) == 2
        assert cancelled.cancelled()
    finally:
        loop.close()


def test_a_post_to_a_closed_loop_is_dropped_without_raising() -> None:
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    loop.close()
    LoopHandoff(loop).post(future, 1)  # nobody can await it any more; the poster must not die
    assert not future.done()


def test_one_mailbox_per_loop() -> None:
    loop, other = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert handoff_for(loop) is handoff_for(loop)
        assert handoff_for(loop) is not handoff_for(other)
    finally:
        loop.close()
        other.close()


def test_ops_completed_together_off_the_loop_resolve_their_watchers_with_one_wake_up() -> None:
    """The purgatory's watch uses the mailbox: 500 ops finished by one key event, one wake-up."""
    loop = CountingLoop()
    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory("handoff")
    try:
        ops = [MockDelayedOperation(60_000) for _ in range(500)]

        async def main() -> list[Outcome]:
            tasks = [asyncio.ensure_future(purgatory.watch(op, ["k"])) for op in ops]
            await asyncio.sleep(0)  # every task submitted its op
            assert purgatory.watched() == 500
            calls_before = loop.threadsafe_calls

            _complete_on_another_thread(purgatory, ops, "k")
            outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 5)
            assert loop.threadsafe_calls - calls_before == 1, "one wake-up for 500 finishes"
            return outcomes

        assert loop.run_until_complete(main()) == [Outcome.COMPLETED] * 500
        assert all(op.completions == 1 for op in ops), "each op finished exactly once"
    finally:
        purgatory.shutdown()
        loop.close()


def test_callbacks_posted_in_a_burst_run_in_one_drain_and_a_failing_one_strands_none() -> None:
    loop = CountingLoop()
    try:
        handoff = LoopHandoff(loop)
        called: list[int] = []

        def record(i: int) -> None:
            if i == 3:
                raise RuntimeError("a waiter's bug")
            called.append(i)

        poster = threading.Thread(target=lambda: [handoff.post_call(record, i) for i in range(10)])
        poster.start()
        poster.join()
        assert loop.threadsafe_calls == 1
        loop.run_until_complete(asyncio.sleep(0))
        assert called == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    finally:
        loop.close()


def test_watch_then_call_calls_back_once_on_the_loop_for_ops_finished_off_it() -> None:
    """The task-free waiter: 500 ops finished off the loop, one wake-up, each callback once, on the loop."""
    loop = CountingLoop()
    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory("call")
    try:
        ops = [MockDelayedOperation(60_000) for _ in range(500)]
        called: list[tuple[MockDelayedOperation, int]] = []

        async def main() -> None:
            for op in ops:
                purgatory.watch_then_call(op, ["k"], lambda op: called.append((op, threading.get_ident())))
            assert purgatory.watched() == 500 and not called
            calls_before = loop.threadsafe_calls

            _complete_on_another_thread(purgatory, ops, "k")
            await asyncio.sleep(0)  # the one drain
            assert loop.threadsafe_calls - calls_before == 1

        loop.run_until_complete(main())
        assert [op for op, _ in called] == ops
        assert {thread for _, thread in called} == {threading.get_ident()}
    finally:
        purgatory.shutdown()
        loop.close()


def test_an_abandoned_waiter_is_finished_cancelled_and_out_of_the_timer() -> None:
    loop = asyncio.new_event_loop()
    purgatory: DelayedOperationPurgatory[MockDelayedOperation] = DelayedOperationPurgatory("abandon")
    try:
        op = MockDelayedOperation(60_000)
        outcomes: list[Outcome | None] = []

        async def main() -> None:
            purgatory.watch_then_call(op, ["k"], lambda finished: outcomes.append(finished.outcome))
            assert purgatory.num_delayed() == 1
            assert purgatory.abandon(op) is True
            assert purgatory.abandon(op) is False  # once

        loop.run_until_complete(main())
        assert outcomes == [Outcome.CANCELLED]  # called back at once: the finish ran on the loop
        assert purgatory.num_delayed() == 0
    finally:
        purgatory.shutdown()
        loop.close()


def test_a_burst_wakes_a_loop_that_keeps_draining_once_per_chunk_not_once_per_post() -> None:
    """The window: the loop runs on another core and drains between two posts, so each post
    finds the flag cleared and wakes it again (~3,400 wake-ups for 10,000 long polls). Here the
    drain runs between posts on purpose; inside a burst the posts wake it every BURST_CHUNK."""
    loop = CountingLoop()
    try:
        handoff = LoopHandoff(loop)
        called: list[int] = []
        for i in range(10):
            handoff.post_call(called.append, i)
            handoff._drain()
        assert loop.threadsafe_calls == 10, "outside a burst: a wake-up per post after a drain"
        loop.threadsafe_calls = 0
        with handoff_burst():
            for i in range(10, 1010):
                handoff.post_call(called.append, i)
                handoff._drain()
        chunks = -(-1000 // BURST_CHUNK)
        assert loop.threadsafe_calls == chunks, f"a wake-up per {BURST_CHUNK} posts and one at the end"
        loop.run_until_complete(asyncio.sleep(0))
        handoff._drain()
        assert called == list(range(1010)), "every callback once, in order"
    finally:
        loop.close()


def test_a_burst_left_by_an_exception_still_wakes_the_loop_for_what_it_held() -> None:
    loop = CountingLoop()
    try:
        handoff = LoopHandoff(loop)
        called: list[int] = []
        try:
            with handoff_burst():
                handoff.post_call(called.append, 1)
                assert loop.threadsafe_calls == 0, "held while the burst lasts"
                raise RuntimeError("a key event's bug")
        except RuntimeError:
            pass
        assert loop.threadsafe_calls == 1, "the burst's end woke the loop all the same"
        loop.run_until_complete(asyncio.sleep(0))
        assert called == [1]
    finally:
        loop.close()


def test_a_nested_burst_ends_with_the_outer_one() -> None:
    loop = CountingLoop()
    try:
        handoff = LoopHandoff(loop)
        with handoff_burst():
            with handoff_burst():
                handoff.post_call(print, "inner")
            assert loop.threadsafe_calls == 0, "the inner end does not wake: the outer burst goes on"
        assert loop.threadsafe_calls == 1
    finally:
        loop.close()


def test_posts_of_other_threads_are_not_held_by_a_burst() -> None:
    loop = CountingLoop()
    try:
        handoff = LoopHandoff(loop)
        with handoff_burst():
            poster = threading.Thread(target=handoff.post_call, args=(print, "elsewhere"))
            poster.start()
            poster.join()
            assert loop.threadsafe_calls == 1, "a burst is its own thread's"
    finally:
        loop.close()


def test_release_burst_wakes_the_loop_for_what_the_burst_holds_before_a_blocking_call() -> None:
    loop = CountingLoop()
    try:
        handoff = LoopHandoff(loop)
        release_burst()  # no burst open: nothing to do
        with handoff_burst():
            handoff.post_call(print, "finished before the read")
            release_burst()  # what RecordReader.read does before it may block
            assert loop.threadsafe_calls == 1, "woken before the blocking call"
            release_burst()
            assert loop.threadsafe_calls == 1, "nothing held: no wake-up"
        assert loop.threadsafe_calls == 1
    finally:
        loop.close()


def test_a_drain_takes_only_what_was_posted_before_it_so_scheduled_writes_run_in_between() -> None:
    """The finishing thread posts while the loop drains. A drain that ran until the mailbox was
    empty followed the whole burst, and the writes its callbacks scheduled (``call_soon``) waited
    for the last post: the first long poll's answer left with the last one's."""
    loop = asyncio.new_event_loop()
    try:
        handoff = LoopHandoff(loop)
        order: list[str] = []

        def answer(name: str) -> None:
            order.append(name)
            loop.call_soon(order.append, f"write {name}")  # as an answer's flush is scheduled
            if name == "first":
                handoff.post_call(answer, "posted while draining")  # the feed thread, meanwhile

        handoff.post_call(answer, "first")
        loop.run_until_complete(asyncio.sleep(0.01))
        assert order == ["first", "write first", "posted while draining", "write posted while draining"]
    finally:
        loop.close()
