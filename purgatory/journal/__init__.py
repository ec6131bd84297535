"""The operation journal: every delayed operation's lifecycle, recorded off the hot path.

``Journal`` is a purgatory listener with a bounded queue and a writer thread; sinks implement
``JournalSink``. The core ships ``FileJournalSink`` (rotated JSON lines) and
``MemoryJournalSink`` (a list, for tests); the Kafka sink lives in
``purgatory.adapters.kafka.journal_sink`` and the analytics in ``purgatory.adapters.spark``.
"""

from ._event import AnsweredOperation, EventType, JournalEvent, JournalFormatError, event_type_for
from ._file_sink import FileJournalSink
from ._journal import Journal, JournalStats, SinkStats
from ._sink import JournalSink, MemoryJournalSink

__all__ = [
    "AnsweredOperation",
    "EventType",
    "FileJournalSink",
    "Journal",
    "JournalEvent",
    "JournalFormatError",
    "JournalSink",
    "JournalStats",
    "MemoryJournalSink",
    "SinkStats",
    "event_type_for",
]
