"""What the fan-out bench's clients that are not ours share: a process of another program holding
the long polls, whose answers reach the bench only when it ends.

:class:`ForeignLongPolls` is the face the bench drives (:mod:`.fanout`): ``polls`` filled at the
end, ``first`` (what the burst probe watches), the client's CPU, its own errors, a bounded
``join``. Each program's module (:mod:`.node_client`, :mod:`.h2load_client`) starts its process
and reads what it writes.
"""

from __future__ import annotations

import shutil
import threading
import time
from abc import ABC, abstractmethod
from typing import ClassVar

from ..measure import cpu_seconds

__all__ = ["STOP_TIMEOUT_S", "ForeignLongPolls", "ForeignPoll"]

STOP_TIMEOUT_S = 5.0


class ForeignPoll:
    """One long poll of a foreign client: when, and with what outcome, it was answered (as
    ``H1LongPoll``; ``body`` holds only the outcome, which is all the bench reads)."""

    __slots__ = ("answered_ns", "body", "partition", "status")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.status = 0
        self.body = b""
        self.answered_ns = 0

    def close(self) -> None:  # the foreign process holds the connection
        pass


class ForeignLongPolls(ABC):
    """A foreign client's process holding ``waiters`` long polls (module docstring)."""

    name: ClassVar[str]  # --client's value, and how notes and results name it
    program: ClassVar[str]  # the executable, looked up on PATH
    reports_first: ClassVar[bool]  # it says when its first answer came (``first``), as it runs
    pid: int

    @classmethod
    def available(cls) -> bool:
        return shutil.which(cls.program) is not None

    def __init__(self, waiters: int, partitions: int, timeout_s: float) -> None:
        self.polls = [ForeignPoll(i % partitions) for i in range(waiters)]
        self.first = ForeignPoll(0)  # answered_ns set at the client's first answer: the probe watches it
        self.cpu_s = 0.0  # the client's user+system CPU over its whole life, when it has ended
        self.errors: dict[str, int] = {}  # the client's own errors, by kind
        self._deadline = time.monotonic() + timeout_s + STOP_TIMEOUT_S
        self._ended = threading.Event()
        self._error: str | None = None

    @abstractmethod
    def wait_opened(self) -> None:
        """Return once the client's requests are out, as far as it can tell (raise if it failed)."""

    @abstractmethod
    def stop(self) -> None:
        """End the client, by its PID if it still runs."""

    def produced(self) -> None:
        """The bench's produce was acknowledged: a client that reports no first answer while it
        runs has the burst probe sent now (the burst begins 2-5 ms later)."""
        if not self.reports_first:
            self.first.answered_ns = time.monotonic_ns()

    def client_cpu_s(self) -> float:
        """The client's CPU so far (while it runs)."""
        return cpu_seconds(self.pid)

    def join(self) -> None:
        """Wait for the client's answers (every waiter answered, or its deadline passed)."""
        self._ended.wait(max(0.0, self._deadline - time.monotonic()))
        if self._error is not None:
            raise RuntimeError(f"the {self.name} client failed: {self._error}")
