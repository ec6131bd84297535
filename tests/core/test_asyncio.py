"""``await purgatory.watch(op, keys)``: outcomes, thread-safe hand-off, cancellation (docs/design.md §3.4)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from purgatory import DelayedOperationPurgatory, Outcome

from .ops import MockDelayedOperation

Purgatory = DelayedOperationPurgatory[MockDelayedOperation]


@pytest.fixture
async def purgatory() -> AsyncIterator[Purgatory]:
    p: Purgatory = DelayedOperationPurgatory("aio")
    yield p
    p.shutdown()


async def test_watch_returns_completed_when_completed_at_once(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(10_000)
    op.completable = True
    assert await purgatory.watch(op, ["k"]) is Outcome.COMPLETED


async def test_watch_of_an_operation_finished_before_submission_returns_its_outcome(
    purgatory: Purgatory,
) -> None:
    """Its finish ran before the waiter existed: watch must not wait forever (issue 15)."""
    op = MockDelayedOperation(60_000)
    assert op.force_complete()
    assert await asyncio.wait_for(purgatory.watch(op, ["k"]), 5) is Outcome.COMPLETED
    assert op.completions == 1 and purgatory.watched() == 0 and purgatory.num_delayed() == 0


async def test_watch_returns_expired_from_the_timer_thread(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(20)
    outcome = await asyncio.wait_for(purgatory.watch(op, ["k"]), 5)
    assert outcome is Outcome.EXPIRED
    assert op.expirations == 1


async def test_completion_from_another_thread_is_handed_to_the_loop(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(60_000)
    loop_thread = threading.get_ident()
    task = asyncio.ensure_future(purgatory.watch(op, ["k"]))
    await asyncio.sleep(0)  # let the task submit the op
    assert purgatory.watched() == 1

    def complete() -> None:
        op.completable = True
        assert threading.get_ident() != loop_thread
        purgatory.check_and_complete("k")

    await asyncio.to_thread(complete)
    assert await asyncio.wait_for(task, 5) is Outcome.COMPLETED


async def test_cancelling_the_awaiting_task_cancels_the_operation(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(60_000)
    task = asyncio.ensure_future(purgatory.watch(op, ["k"]))
    await asyncio.sleep(0)
    assert purgatory.num_delayed() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert op.outcome is Outcome.CANCELLED
    assert op.completions == 1 and op.expirations == 0
    assert purgatory.num_delayed() == 0, "the timer entry is removed"
    op.completable = True
    assert purgatory.check_and_complete("k") == 0, "a cancelled op does not complete again"


async def test_ten_thousand_concurrent_awaiters(purgatory: Purgatory) -> None:
    n = 10_000
    ops = [MockDelayedOperation(60_000 if i % 2 else 30) for i in range(n)]
    keys = [f"k{i % 50}" for i in range(n)]
    tasks = [asyncio.ensure_future(purgatory.watch(op, [key])) for op, key in zip(ops, keys, strict=True)]
    await asyncio.sleep(0)
    for op in ops[1::2]:
        op.completable = True
    await asyncio.to_thread(lambda: [purgatory.check_and_complete(f"k{i}") for i in range(50)])
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert outcomes.count(Outcome.COMPLETED) == n // 2
    assert outcomes.count(Outcome.EXPIRED) == n // 2
    assert all(op.completions == 1 for op in ops)


async def test_event_loop_keeps_running_while_operations_wait(purgatory: Purgatory) -> None:
    op = MockDelayedOperation(200)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not op.is_completed():
            ticks += 1
            await asyncio.sleep(0.005)

    outcome, _ = await asyncio.gather(purgatory.watch(op, ["k"]), ticker())
    assert outcome is Outcome.EXPIRED
    assert ticks >= 5, "the loop was never blocked while the operation waited"
