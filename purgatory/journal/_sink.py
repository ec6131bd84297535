"""The port every journal sink implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ._event import JournalEvent

__all__ = ["JournalSink", "MemoryJournalSink"]


@runtime_checkable
class JournalSink(Protocol):
    """Where journal events go (files, a Kafka topic, …).

    Concurrency contract: the journal's writer thread is the only caller, one call at a time, so
    a sink needs no locking of its own. ``write`` may raise: the journal logs the error, counts the
    batch as failed for this sink and carries on with the next batch.
    """

    def write(self, events: Sequence[JournalEvent]) -> None:
        """Accept a batch, in the order the events happened on each operation."""

    def flush(self) -> None:
        """Make everything accepted so far durable/visible (bounded: a sink never waits forever)."""

    def close(self) -> None:
        """Flush and release resources; no ``write`` follows."""


class MemoryJournalSink:
    """A sink that keeps every event in ``events``, in order: for tests and examples."""

    def __init__(self) -> None:
        self.events: list[JournalEvent] = []

    def write(self, events: Sequence[JournalEvent]) -> None:
        self.events.extend(events)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
