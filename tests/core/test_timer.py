"""Port of Kafka's TimerTest (SystemTimer, tick 1 ms, 3 buckets) plus MockTimer behaviour."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from purgatory import PurgatoryClosedError, SystemTimer, TimerTask
from purgatory.testing import MockTime, MockTimer
from purgatory.timer import MAX_WHEEL_SIZE


class _CountDownLatch:
    def __init__(self, count: int) -> None:
        self._count = count
        self._cond = threading.Condition()

    def count_down(self) -> None:
        with self._cond:
            self._count -= 1
            if self._count <= 0:
                self._cond.notify_all()

    def wait(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._count <= 0, timeout_s)


class _TestTask(TimerTask):
    def __init__(self, delay_ms: int, task_id: int, latch: _CountDownLatch, output: list[int]) -> None:
        super().__init__(delay_ms)
        self.task_id = task_id
        self.latch = latch
        self.output = output
        self._completed = threading.Lock()

    def run(self) -> None:
        # A task must run at most once; the lock turns a second run into a visible failure.
        if self._completed.acquire(blocking=False):
            self.output.append(self.task_id)
            self.latch.count_down()
        else:
            self.output.append(-10_000 - self.task_id)


def _drive(timer: SystemTimer, latch: _CountDownLatch, timeout_s: float = 5.0) -> bool:
    """Play the reaper: advance the clock until ``latch`` opens or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not latch.wait(0):
        if time.monotonic() > deadline:
            return False
        timer.advance_clock(20)
    return True


@pytest.fixture
def timer() -> Iterator[SystemTimer]:
    t = SystemTimer("test", tick_ms=1, wheel_size=3)
    yield t
    t.close()


def test_already_expired_task(timer: SystemTimer) -> None:
    output: list[int] = []
    latches = []
    for i in range(-5, 0):
        latch = _CountDownLatch(1)
        latches.append(latch)
        timer.add(_TestTask(i, i, latch, output))
    timer.advance_clock(0)
    for latch in latches:
        assert latch.wait(3), "already expired tasks should run"
    assert sorted(output) == list(range(-5, 0)), "output of already expired tasks"


def test_task_expiration(timer: SystemTimer) -> None:
    """Kafka's 585-task case: 5 + 2 x 90 + 400 tasks over three wheel levels."""
    output: list[int] = []
    tasks: list[_TestTask] = []
    ids: list[int] = []
    latches: list[_CountDownLatch] = []

    def make(delay: int) -> None:
        latch = _CountDownLatch(1)
        tasks.append(_TestTask(delay, delay, latch, output))
        ids.append(delay)
        latches.append(latch)

    for i in range(0, 5):
        make(i)
    for i in range(10, 100):
        make(i)
        make(i)
    for i in range(100, 500):
        make(i)
    assert len(tasks) == 585

    for task in tasks:
        timer.add(task)
    deadline_loops = 0
    while timer.advance_clock(2000):
        deadline_loops += 1
        assert deadline_loops < 10_000, "advance_clock kept finding due buckets forever"
    for latch in latches:
        assert latch.wait(3)
    assert sorted(output) == sorted(ids), "output should match"
    assert timer.size() == 0


def test_cancelled_task_never_runs_and_leaves_the_count(timer: SystemTimer) -> None:
    output: list[int] = []
    latch = _CountDownLatch(1)
    cancelled = _TestTask(5, 1, _CountDownLatch(1), output)
    kept = _TestTask(10, 2, latch, output)
    timer.add(cancelled)
    timer.add(kept)
    assert timer.size() == 2
    cancelled.cancel()
    assert timer.size() == 1, "cancel removes the entry at once"
    assert _drive(timer, latch)
    assert output == [2]


class _BlockingTask(TimerTask):
    """Holds the executor until released, so the tasks due after it wait in its queue."""

    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        self.started.set()
        self.release.wait(10)


def test_due_tasks_queued_for_the_executor_still_count_as_pending(timer: SystemTimer) -> None:
    """size() falls when a task starts, not when the wheel hands it over: a purgatory's reaper
    compares it with the operations it watches, and an expiring bucket waiting for the executor
    looked like thousands of finished operations to purge."""
    blocker = _BlockingTask(0)  # due now: straight to the executor
    timer.add(blocker)
    assert blocker.started.wait(5)
    latch = _CountDownLatch(2)
    output: list[int] = []
    timer.add(_TestTask(1, 1, latch, output))
    timer.add(_TestTask(1, 2, latch, output))
    deadline = time.monotonic() + 5
    while timer.advance_clock(20) is False:  # until the bucket holding both is flushed
        assert time.monotonic() < deadline, "the bucket never came due"
    assert output == [], "the executor is held: nothing ran yet"
    assert timer.size() == 2, "due and queued, not yet run: still pending"
    blocker.release.set()
    # Keep playing the reaper: a bucket flushed early (the wheel's clock lagging real time) may
    # have put a task back into the wheel instead of handing it to the executor.
    assert _drive(timer, latch), "the queued tasks never ran"
    assert sorted(output) == [1, 2]
    assert timer.size() == 0, "a task leaves the count as it starts"


def test_re_adding_a_task_replaces_its_entry(timer: SystemTimer) -> None:
    output: list[int] = []
    latch = _CountDownLatch(1)
    task = _TestTask(10_000, 1, latch, output)
    timer.add(task)
    task.delay_ms = 1
    timer.add(task)
    assert timer.size() == 1, "a task is in at most one bucket"
    assert _drive(timer, latch)
    assert output == [1]


def test_failing_task_does_not_kill_the_executor(timer: SystemTimer) -> None:
    class Boom(TimerTask):
        def run(self) -> None:
            raise RuntimeError("user task failed")

    output: list[int] = []
    latch = _CountDownLatch(1)
    timer.add(Boom(0))
    timer.add(_TestTask(0, 7, latch, output))
    # Due at once, but the wheel's clock may lag by a tick: someone must advance it (the reaper).
    assert _drive(timer, latch), "the executor must survive a failing task"
    assert output == [7]


def test_executor_thread_is_named_after_the_timer(timer: SystemTimer) -> None:
    names = {t.name for t in threading.enumerate()}
    assert "executor-test" in names


def test_add_after_close_is_refused() -> None:
    timer = SystemTimer("closing")
    timer.close()
    timer.close()  # idempotent
    with pytest.raises(PurgatoryClosedError):
        timer.add(_TestTask(1, 1, _CountDownLatch(1), []))
    assert not any(t.name == "executor-closing" for t in threading.enumerate())


@pytest.mark.parametrize(
    ("field", "kwargs", "error"),
    [
        ("tick_ms", {"tick_ms": 0}, ValueError),
        ("wheel_size", {"wheel_size": -1}, ValueError),
        # Compiled, an int parameter read True as 1 and accepted it.
        ("tick_ms", {"tick_ms": True}, TypeError),
        ("wheel_size", {"wheel_size": True}, TypeError),
        ("tick_ms", {"tick_ms": 1.5}, TypeError),
        ("wheel_size", {"wheel_size": "20"}, TypeError),
        # Unbounded once: 2**40 allocated bucket after bucket until the kernel killed the process
        # (not tried here: on the old code it would take the machine's memory with it).
        ("wheel_size", {"wheel_size": MAX_WHEEL_SIZE + 1}, ValueError),
    ],
)
def test_bad_timer_configuration_is_refused(
    field: str, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error, match=field):
        SystemTimer("bad", **kwargs)  # type: ignore[arg-type]
    assert not any(t.name == "executor-bad" for t in threading.enumerate()), "no executor left behind"


def test_a_timer_of_the_largest_wheel_size_works() -> None:
    timer = SystemTimer("largest", wheel_size=MAX_WHEEL_SIZE)
    try:
        latch = _CountDownLatch(1)
        timer.add(_TestTask(5, 1, latch, []))
        assert _drive(timer, latch), "a task on a wheel of MAX_WHEEL_SIZE buckets runs when due"
    finally:
        timer.close()


def test_advance_clock_returns_false_when_nothing_is_due(timer: SystemTimer) -> None:
    assert timer.advance_clock(1) is False


def test_wakeup_ends_a_waiting_advance_clock_early(timer: SystemTimer) -> None:
    started = threading.Event()
    result: list[bool] = []

    def advance() -> None:
        started.set()
        result.append(timer.advance_clock(60_000))

    thread = threading.Thread(target=advance)
    thread.start()
    assert started.wait(3)
    # Keep waking until the poller has returned: the first wakeup may land before it waits.
    while thread.is_alive():
        timer.wakeup()
        thread.join(0.05)
    assert result == [False]


# -- MockTimer -------------------------------------------------------------------------------


class _Recorder(TimerTask):
    def __init__(self, delay_ms: int, time: MockTime, runs: list[tuple[int, int]], name: int) -> None:
        super().__init__(delay_ms)
        self.time, self.runs, self.name = time, runs, name

    def run(self) -> None:
        self.runs.append((self.name, self.time.milliseconds()))


def test_mock_timer_runs_tasks_due_at_the_new_time_in_order() -> None:
    timer = MockTimer(MockTime(1000))
    runs: list[tuple[int, int]] = []
    for name, delay in enumerate([30, 10, 20, 10_000]):
        timer.add(_Recorder(delay, timer.time, runs, name))
    assert timer.size() == 4
    assert timer.advance_clock(9) is False
    assert runs == []
    assert timer.advance_clock(1) is True
    assert runs == [(1, 1010)], "a task due exactly at the new time runs (due at, not strictly past)"
    timer.advance_clock(20)
    assert runs == [(1, 1010), (2, 1030), (0, 1030)]
    assert timer.size() == 1


def test_mock_timer_runs_non_positive_delays_on_the_adding_thread() -> None:
    timer = MockTimer()
    runs: list[tuple[int, int]] = []
    timer.add(_Recorder(0, timer.time, runs, 1))
    timer.add(_Recorder(-5, timer.time, runs, 2))
    assert runs == [(1, 0), (2, 0)]
    assert timer.size() == 0


def test_mock_time_refuses_to_go_back() -> None:
    with pytest.raises(ValueError, match="ms"):
        MockTime().sleep(-1)
