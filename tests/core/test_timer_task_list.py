"""Port of Kafka's TimerTaskListTest: re-adding moves a task, cancel removes in O(1)."""

from __future__ import annotations

from purgatory.timer import TaskCounter, TimerTask, TimerTaskEntry, TimerTaskList


class _Task(TimerTask):
    def run(self) -> None:
        pass


def _cancel_all(bucket: TimerTaskList) -> None:
    bucket.foreach(lambda task: task.cancel())  # type: ignore[attr-defined]


def test_all() -> None:
    counter = TaskCounter()
    list1, list2, list3 = TimerTaskList(counter), TimerTaskList(counter), TimerTaskList(counter)
    tasks = [_Task(0) for _ in range(10)]
    for task in tasks:
        list1.add(TimerTaskEntry(task, 10))
    assert counter.value == 10

    # reinserting the existing tasks shouldn't change the task count
    for task in tasks[:4]:
        before = counter.value
        list2.add(TimerTaskEntry(task, 10))
        assert counter.value == before
    assert len(list1) == 6
    assert len(list2) == 4
    assert counter.value == 10

    for task in tasks[4:]:
        before = counter.value
        list3.add(TimerTaskEntry(task, 10))
        assert counter.value == before
    assert len(list1) == 0
    assert len(list2) == 4
    assert len(list3) == 6
    assert counter.value == 10

    # cancel tasks in lists
    _cancel_all(list1)
    assert len(list1) == 0
    _cancel_all(list2)
    assert len(list2) == 0
    _cancel_all(list3)
    assert len(list3) == 0
    assert counter.value == 0


def test_flush_hands_every_entry_over_in_insertion_order_and_resets_expiration() -> None:
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    entries = [TimerTaskEntry(_Task(0), 5) for _ in range(5)]
    for entry in entries:
        bucket.add(entry)
    assert bucket.set_expiration(5)
    assert not bucket.set_expiration(5), "setting the same expiration reports no change"
    seen: list[TimerTaskEntry] = []
    bucket.flush(seen.append)
    assert seen == entries
    assert len(bucket) == 0 and counter.value == 0
    assert bucket.get_expiration() == -1
    assert all(entry.list is None for entry in entries)


def test_cancel_of_a_middle_entry_keeps_the_links_consistent() -> None:
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    tasks = [_Task(0) for _ in range(3)]
    for task in tasks:
        bucket.add(TimerTaskEntry(task, 1))
    tasks[1].cancel()
    assert tasks[1].is_cancelled()
    remaining: list[object] = []
    bucket.foreach(remaining.append)
    assert remaining == [tasks[0], tasks[2]]
    tasks[1].cancel()  # cancelling twice is harmless
    assert counter.value == 2
