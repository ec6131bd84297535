"""What the core's race stress tests share: the hand-off from submitting threads to a finisher."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    """Ops a submitting thread hands to a finishing thread, oldest first.

    Like Kafka's performance tool, the submitter hands an op over *before* submitting it, so the
    finisher can finish it before, during or just after its submission: the interleavings the
    stress tests are after. ``drain`` spins with ``sleep(0)`` (a GIL hand-over, not a wait for
    time to pass) until the submitters have ``close``d it and nothing is left."""

    def __init__(self) -> None:
        self._ops: collections.deque[T] = collections.deque()
        self._closed = threading.Event()

    def __len__(self) -> int:
        return len(self._ops)

    def put(self, op: T) -> None:
        self._ops.append(op)

    def close(self) -> None:
        """No more ops will come: ``drain`` returns once the ones handed over are finished."""
        self._closed.set()

    def drain(self, finish: Callable[[T], None]) -> None:
        while True:
            try:
                op = self._ops.popleft()
            except IndexError:
                if self._closed.is_set() and not self._ops:
                    return
                time.sleep(0)
                continue
            finish(op)
