"""AnswerBurst's deferred closes: a connection its client ended while a burst runs is closed once
an iteration of the loop passes without a run — a slice at a time, and never later than
MAX_LINGER_S however long bursts go on. Fake transports on a real asyncio loop (the test's)."""

from __future__ import annotations

import asyncio

import pytest
from purgatory.adapters.service.http.h1 import _burst
from purgatory.adapters.service.http.h1._burst import AnswerBurst


class FakeTransport:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


async def _iterations(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_without_a_burst_nothing_is_deferred() -> None:
    burst = AnswerBurst(asyncio.get_running_loop())
    assert burst.defer_close(FakeTransport()) is False  # type: ignore[arg-type]


async def test_deferred_closes_wait_for_the_end_of_the_burst_then_go_a_slice_per_iteration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_burst, "CLOSE_SLICE", 2)

    burst = AnswerBurst(asyncio.get_running_loop())
    burst._run()  # a run (of no connections): the burst is on
    transports = [FakeTransport() for _ in range(5)]
    assert all(burst.defer_close(t) for t in transports)  # type: ignore[arg-type]
    for _ in range(5):  # runs go on: nothing closes
        burst._run()
        await _iterations(1)
    assert [t.closed for t in transports] == [0] * 5
    closed_per_iteration = []
    for _ in range(6):
        await _iterations(1)
        closed_per_iteration.append(sum(t.closed for t in transports))
    assert closed_per_iteration[-1] == 5 and all(t.closed == 1 for t in transports), "each once"
    assert closed_per_iteration[:3] == [0, 2, 4] or closed_per_iteration[:3] == [2, 4, 5], (
        f"a slice of 2 per iteration: {closed_per_iteration}"
    )
    assert burst.defer_close(FakeTransport()) is False, "over: closes are not deferred any more"  # type: ignore[arg-type]


async def test_bursts_that_do_not_end_hold_a_close_no_longer_than_max_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_burst, "MAX_LINGER_S", 0.05)

    loop = asyncio.get_running_loop()
    burst = AnswerBurst(loop)
    burst._run()
    transport = FakeTransport()
    assert burst.defer_close(transport)  # type: ignore[arg-type]
    deferred_at = loop.time()
    while not transport.closed and loop.time() - deferred_at < 5:
        burst._run()  # a run in every iteration of the loop, forever
        await asyncio.sleep(0)
    assert transport.closed == 1
    assert 0.05 <= loop.time() - deferred_at < 1.0


class BrokenTransport(FakeTransport):
    def close(self) -> None:
        raise RuntimeError("broken")


async def test_a_failing_close_is_reported_and_the_others_still_close() -> None:
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    loop.set_exception_handler(lambda _, context: errors.append(context["message"]))
    burst = AnswerBurst(loop)
    burst._run()
    others = [FakeTransport(), FakeTransport()]
    for t in [others[0], BrokenTransport(), others[1]]:
        assert burst.defer_close(t)  # type: ignore[arg-type]
    await _iterations(4)
    assert [t.closed for t in others] == [1, 1]
    assert errors == ["deferred close failed"]
