"""kafka-purgatory: Apache Kafka's broker purgatory as a Python framework.

Hierarchical timing wheels (:class:`SystemTimer`), delayed operations finished exactly once
(:class:`DelayedOperation`), sharded watcher lists and the expiration reaper
(:class:`DelayedOperationPurgatory`). The wheel's parts (buckets, levels, the delay queue) are
in :mod:`purgatory.timer`.
"""

# First: decides between the mypyc-compiled timer modules and their sources (see _accel.py).
from . import _accel  # noqa: F401  # isort: skip
from ._errors import InvalidOperationError, PurgatoryClosedError, PurgatoryError, PurgatoryFullError
from ._logging import configure_logging
from ._operation import DelayedOperation
from ._outcome import Outcome
from ._purgatory import DelayedOperationPurgatory, ExpiredOperationReaper, PurgatoryListener
from .testing import MockTime, MockTimer
from .timer import SystemTimer, Timer, TimerTask

__all__ = [
    "DelayedOperation",
    "DelayedOperationPurgatory",
    "ExpiredOperationReaper",
    "InvalidOperationError",
    "MockTime",
    "MockTimer",
    "Outcome",
    "PurgatoryClosedError",
    "PurgatoryError",
    "PurgatoryFullError",
    "PurgatoryListener",
    "SystemTimer",
    "Timer",
    "TimerTask",
    "configure_logging",
]

__version__ = "0.1.0"
