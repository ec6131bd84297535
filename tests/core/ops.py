"""Operations used by the unit tests (Kafka's MockDelayedOperation and friends)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from purgatory import DelayedOperation
from purgatory._operation import LockLike


class MockDelayedOperation(DelayedOperation):
    """Completes when ``completable`` is set; records every callback."""

    def __init__(self, delay_ms: int, lock: LockLike | None = None) -> None:
        super().__init__(delay_ms, lock)
        self.completable = False
        self.completions = 0
        self.expirations = 0
        self.try_calls = 0
        self.finished = threading.Event()
        self.on_try: Callable[[], None] | None = None

    def try_complete(self) -> bool:
        self.try_calls += 1
        if self.on_try is not None:
            self.on_try()
        if self.completable:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions += 1
        self.finished.set()

    def on_expiration(self) -> None:
        self.expirations += 1

    def await_finish(self, timeout_s: float = 5.0) -> bool:
        return self.finished.wait(timeout_s)
