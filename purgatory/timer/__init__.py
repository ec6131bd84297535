"""The timer: Kafka's hierarchical timing wheel, the one public face of this package.

* :class:`TimerTask` / :class:`TimerTaskEntry` (``_task.py``): a task and its place in a bucket.
* :class:`TimerTaskList` and :class:`TaskCounter` (``_task_list.py``): one bucket, and the count
  of pending tasks shared by all buckets of a timer.
* :class:`TimingWheel` (``_timing_wheel.py``): one level of the wheel; overflow wheels above it.
* :class:`DelayQueue` (``_delay_queue.py``): buckets ordered by expiration.
* :class:`WheelTimerCore` (``_wheel_timer.py``): wheel + delay queue + counter, shared by
  :class:`SystemTimer` (``_system_timer.py``, the monotonic clock) and ``purgatory.testing.MockTimer``.
* :class:`Timer` (``_protocol.py``): what a purgatory needs from its timer.

The modules except ``_protocol.py`` are compiled with mypyc (``purgatory/_accel.py``).
"""

from ._delay_queue import DelayQueue
from ._protocol import Timer
from ._system_timer import SystemTimer, add_task, monotonic_ms
from ._task import TimerTask, TimerTaskEntry, cancel_task, leave_bucket
from ._task_list import TaskCounter, TimerTaskList
from ._timing_wheel import MAX_WHEEL_SIZE, TimingWheel, bucket_expiration, bucket_index, wheel_start
from ._wheel_timer import WheelTimerCore

__all__ = [
    "MAX_WHEEL_SIZE",
    "DelayQueue",
    "SystemTimer",
    "TaskCounter",
    "Timer",
    "TimerTask",
    "TimerTaskEntry",
    "TimerTaskList",
    "TimingWheel",
    "WheelTimerCore",
    "add_task",
    "bucket_expiration",
    "bucket_index",
    "cancel_task",
    "leave_bucket",
    "monotonic_ms",
    "wheel_start",
]
