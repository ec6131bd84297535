"""TimingWheel: slot arithmetic at the boundaries, placement, overflow wheels, the bucket queue rule."""

from __future__ import annotations

import pytest

from purgatory.timer import (
    TaskCounter,
    TimerTask,
    TimerTaskEntry,
    TimerTaskList,
    TimingWheel,
    bucket_expiration,
    bucket_index,
    wheel_start,
)


class _Task(TimerTask):
    def run(self) -> None:
        pass


class _RecordingQueue:
    def __init__(self) -> None:
        self.offered: list[tuple[TimerTaskList, int]] = []

    def offer(self, bucket: TimerTaskList) -> None:
        self.offered.append((bucket, bucket.get_expiration()))


def _wheel(tick_ms: int = 1, wheel_size: int = 20, start_ms: int = 0) -> tuple[TimingWheel, _RecordingQueue]:
    queue = _RecordingQueue()
    return TimingWheel(tick_ms, wheel_size, start_ms, TaskCounter(), queue), queue


@pytest.mark.parametrize(
    ("start_ms", "tick_ms", "expected"),
    [(0, 1, 0), (7, 1, 7), (7, 5, 5), (10, 5, 10), (14, 5, 10), (19, 20, 0), (20, 20, 20), (21, 20, 20)],
)
def test_wheel_start_is_rounded_down_to_a_tick(start_ms: int, tick_ms: int, expected: int) -> None:
    assert wheel_start(start_ms, tick_ms) == expected


def test_bucket_index_and_expiration_exhaustively_at_the_boundaries() -> None:
    for tick_ms in (1, 2, 3, 20):
        for wheel_size in (1, 3, 20):
            for expiration in range(0, 3 * tick_ms * wheel_size + 2):
                index = bucket_index(expiration, tick_ms, wheel_size)
                assert 0 <= index < wheel_size
                assert index == (expiration // tick_ms) % wheel_size
                start = bucket_expiration(expiration, tick_ms)
                assert start <= expiration < start + tick_ms, "a bucket covers exactly one tick"
                assert start % tick_ms == 0


def test_wheel_interval_and_current_time() -> None:
    wheel, _ = _wheel(tick_ms=5, wheel_size=4, start_ms=13)
    assert wheel.interval == 20
    assert wheel.current_time_ms == 10


@pytest.mark.parametrize(("tick_ms", "wheel_size"), [(0, 20), (-1, 20), (1, 0), (1, -3)])
def test_non_positive_tick_or_wheel_size_is_refused_naming_the_field(tick_ms: int, wheel_size: int) -> None:
    field = "tick_ms" if tick_ms <= 0 else "wheel_size"
    with pytest.raises(ValueError, match=field):
        TimingWheel(tick_ms, wheel_size, 0, TaskCounter(), _RecordingQueue())


def test_entry_within_current_tick_is_already_expired() -> None:
    wheel, queue = _wheel(tick_ms=1, start_ms=100)
    assert not wheel.add(TimerTaskEntry(_Task(0), 100)), (
        "Task within current tick should be expired immediately"
    )
    assert not wheel.add(TimerTaskEntry(_Task(0), 50)), "Task in the past should be expired immediately"
    assert queue.offered == []


def test_cancelled_entry_is_not_added() -> None:
    wheel, queue = _wheel()
    task = _Task(5)
    entry = TimerTaskEntry(task, 5)
    task.cancel()
    assert not wheel.add(entry)
    assert queue.offered == []


def test_entry_within_interval_goes_to_its_bucket_and_queues_it_once() -> None:
    wheel, queue = _wheel(tick_ms=1, wheel_size=20, start_ms=0)
    assert wheel.add(TimerTaskEntry(_Task(5), 5))
    assert wheel.add(TimerTaskEntry(_Task(5), 5))
    assert len(queue.offered) == 1, "a bucket is queued only when its expiration changes"
    bucket, expiration = queue.offered[0]
    assert expiration == 5
    assert len(bucket) == 2
    assert wheel.overflow_wheel is None


def test_entry_beyond_interval_goes_to_an_overflow_wheel_created_on_demand() -> None:
    wheel, queue = _wheel(tick_ms=1, wheel_size=20, start_ms=0)
    assert wheel.add(TimerTaskEntry(_Task(90), 90))
    overflow = wheel.overflow_wheel
    assert overflow is not None
    assert overflow.tick_ms == 20 and overflow.interval == 400
    assert queue.offered[-1][1] == 80, "the level-1 bucket covering 90 starts at 80"
    assert wheel.add(TimerTaskEntry(_Task(1000), 1000))
    assert overflow.overflow_wheel is not None and overflow.overflow_wheel.tick_ms == 400


def test_advance_clock_moves_overflow_wheels_and_cascades_entries_down() -> None:
    wheel, queue = _wheel(tick_ms=1, wheel_size=20, start_ms=0)
    entry = TimerTaskEntry(_Task(90), 90)
    wheel.add(entry)
    bucket, expiration = queue.offered[-1]
    wheel.advance_clock(expiration)
    assert wheel.current_time_ms == 80
    assert wheel.overflow_wheel is not None and wheel.overflow_wheel.current_time_ms == 80
    re_added: list[TimerTaskEntry] = []
    bucket.flush(lambda e: re_added.append(e) if wheel.add(e) else None)
    assert re_added == [entry], "at 80 the 90 ms entry belongs to the finest wheel again"
    assert queue.offered[-1][1] == 90
    assert bucket.get_expiration() == -1, "a flushed bucket leaves the queue's keying"


def test_advance_clock_within_a_tick_does_nothing() -> None:
    wheel, _ = _wheel(tick_ms=10, wheel_size=20, start_ms=100)
    wheel.advance_clock(109)
    assert wheel.current_time_ms == 100
    wheel.advance_clock(110)
    assert wheel.current_time_ms == 110
