"""Hypothesis properties of the timing wheel, driven deterministically through MockTimer.

Every non-cancelled task runs exactly once, never before its expiration and never later than
the first clock advance that reaches it (tick 1 ms: at most one tick late); cancelled tasks never run.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory import TimerTask
from purgatory.testing import MockTime, MockTimer


class _Probe(TimerTask):
    def __init__(self, delay_ms: int, time: MockTime, runs: dict[int, list[int]], ident: int) -> None:
        super().__init__(delay_ms)
        self.time, self.runs, self.ident = time, runs, ident

    def run(self) -> None:
        self.runs.setdefault(self.ident, []).append(self.time.milliseconds())


_step = st.one_of(
    st.tuples(st.just("add"), st.integers(min_value=-5, max_value=30_000)),
    st.tuples(st.just("cancel"), st.integers(min_value=0, max_value=10_000)),
    st.tuples(st.just("advance"), st.integers(min_value=0, max_value=5_000)),
)


@settings(max_examples=200, deadline=None)
@given(start=st.integers(min_value=0, max_value=10**9), steps=st.lists(_step, max_size=80))
def test_every_live_task_runs_exactly_once_on_time(start: int, steps: list[tuple[str, int]]) -> None:
    timer = MockTimer(MockTime(start))
    runs: dict[int, list[int]] = {}
    tasks: list[_Probe] = []
    expiration: dict[int, int] = {}
    cancelled: set[int] = set()
    # window[i]: the (previous, new) time of the advance that should have run task i
    ran_at_advance: dict[int, tuple[int, int]] = {}

    for kind, value in steps:
        now = timer.time.milliseconds()
        if kind == "add":
            ident = len(tasks)
            task = _Probe(value, timer.time, runs, ident)
            tasks.append(task)
            expiration[ident] = now + value
            timer.add(task)
            if value <= 0:
                ran_at_advance[ident] = (now, now)
        elif kind == "cancel" and tasks:
            ident = value % len(tasks)
            if ident not in runs:
                tasks[ident].cancel()
                cancelled.add(ident)
        elif kind == "advance":
            timer.advance_clock(value)
            new = timer.time.milliseconds()
            for ident, exp in expiration.items():
                if ident not in cancelled and ident not in ran_at_advance and now < exp <= new:
                    ran_at_advance[ident] = (now, new)
        live = [i for i in expiration if i not in cancelled and i not in runs]
        assert timer.size() == len(live), "size() counts exactly the pending, non-cancelled tasks"

    # Finally let everything due run.
    now = timer.time.milliseconds()
    timer.advance_clock(40_000)
    for ident in expiration:
        if ident not in cancelled and ident not in ran_at_advance:
            ran_at_advance[ident] = (now, timer.time.milliseconds())

    for ident in expiration:
        if ident in cancelled:
            assert ident not in runs, f"cancelled task {ident} ran"
            continue
        assert len(runs.get(ident, [])) == 1, f"task {ident} ran {len(runs.get(ident, []))} times"
        ran = runs[ident][0]
        assert ran >= expiration[ident] or tasks[ident].delay_ms <= 0, "never before its expiration"
        assert ran == ran_at_advance[ident][1], "runs during the first advance that reaches its expiration"
    assert timer.size() == 0
