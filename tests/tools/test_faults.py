"""Faults without Kafka: every user callback raising, many times, on a real purgatory."""

from __future__ import annotations

from purgatory.tools.reliability import FAULTY_OPS_PER_KIND, callback_faults


def test_exceptions_from_every_user_callback_never_stop_the_purgatory() -> None:
    """try_complete (at submission and on key events), on_complete, on_expiration and a listener
    all raise; the purgatory keeps serving, each affected op ends once with a clear outcome, and
    every failure is counted and logged."""
    result = callback_faults()
    assert result.survived, result.problems
    assert result.outcomes == {
        "expired": 2 * FAULTY_OPS_PER_KIND,  # try_complete raising on events, on_expiration raising
        "completed": 4 * FAULTY_OPS_PER_KIND,  # on_complete raising, and every healthy neighbour
        "refused (raised to the caller)": FAULTY_OPS_PER_KIND,  # try_complete raising at submission
    }
    assert result.user_code_errors == 3 * FAULTY_OPS_PER_KIND
    assert result.logged_errors >= result.user_code_errors


def test_an_event_loop_closed_under_an_awaited_operation_does_not_stop_the_drain() -> None:
    """An application closes its event loop while a ``purgatory.watch`` is still pending (no
    cancellation reaches the task). Handing the outcome to that loop then raises ("Event loop is
    closed") on the finishing thread; inside ``shutdown(drain=True)`` that aborted the drain and
    every operation after it was never finished. The finish must survive a dead waiter."""
    import asyncio

    from purgatory import DelayedOperation, DelayedOperationPurgatory, MockTimer, Outcome

    class Pending(DelayedOperation):
        def __init__(self) -> None:
            super().__init__(60_000)
            self.completions = 0

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            self.completions += 1

    purgatory: DelayedOperationPurgatory[Pending] = DelayedOperationPurgatory(
        "closed-loop", timer=MockTimer(), reaper_enabled=False
    )
    awaited = Pending()
    loop = asyncio.new_event_loop()

    async def submit() -> asyncio.Future[Outcome]:
        task = asyncio.ensure_future(purgatory.watch(awaited, ["k"]))
        await asyncio.sleep(0)  # the op is submitted; its task stays pending
        return task

    loop.run_until_complete(submit())
    loop.close()  # closed with the task pending: nothing will ever cancel it
    others = [Pending() for _ in range(5)]
    for op in others:
        purgatory.try_complete_else_watch(op, ["k"])
    purgatory.shutdown(drain=True)
    assert awaited.outcome is Outcome.EXPIRED and awaited.completions == 1
    assert [op.outcome for op in others] == [Outcome.EXPIRED] * 5, "the drain stopped at the dead waiter"
    assert all(op.completions == 1 for op in others)


def test_an_operation_resubmitted_after_cancel_for_key_is_drained_at_shutdown() -> None:
    """``cancel_for_key`` hands its operations back to the caller (drain leaves them alone). A
    caller that re-submits one — moved to a new key, say — gives it back to the purgatory; it
    used to stay marked as the caller's, so shutdown's drain skipped it and, its timer closed with
    the purgatory, nothing ever finished it."""
    from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome

    class Pending(DelayedOperation):
        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            pass

    purgatory: DelayedOperationPurgatory[Pending] = DelayedOperationPurgatory("moved")  # owns its timer
    op = Pending(60_000)
    purgatory.try_complete_else_watch(op, ["old-leader"])
    assert purgatory.cancel_for_key("old-leader") == [op]
    purgatory.try_complete_else_watch(op, ["new-leader"])
    assert purgatory.num_delayed() == 1 and purgatory.watched() == 1
    purgatory.shutdown(drain=True)
    assert op.outcome is Outcome.EXPIRED, "the re-submitted operation was left unfinished by the drain"
