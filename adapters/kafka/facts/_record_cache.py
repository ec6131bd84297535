"""SharedReadReader: one Kafka read serves every long poll waiting on the same partition range.

Without it, each :class:`DelayedFetch` reads its own records when it completes: 500 long polls
on one partition answered by one new record cost 500 reads (~15 ms each, serialised on the
reader's consumer) — measured 9.8 s from the produce to the last answer, with the change feed
busy all along. Kafka's broker reads its local log (the page cache) instead; this is the
page cache of a :class:`KafkaPurgatory` connected with ``shared_reads=True`` (the HTTP service's).

Algorithm: per partition, up to ``SPANS_PER_PARTITION`` contiguous *spans* ``[start, end)`` of
records read before — by a fetch, or pushed by the change feed's tail (``append``), which follows
every watched partition's end: a long poll woken by a new record then reads it from here, not
from Kafka. ``read(key, start, end, max_bytes)`` returns what the span covering ``start`` holds
from there on, then reads only the missing tail ``[span.end, end)`` from Kafka and extends the
span with it (a read that starts in no span opens a new one, and the partition's least recently
used span goes past ``SPANS_PER_PARTITION``). Why more than one: readers of a range behind the end
and the tail at the end are two access patterns of one partition; with a single span each
replaced the other — the tail's first push (the record below the end, ``PartitionTail``'s
``read_last``) threw away the 4 MB range 100 unread long polls had just read, so every replay
round read it from Kafka again and rendered a new ~18 MB body while the last one was still held
(issue 31, item 6: peaks of +48-83 MB). Offsets are immutable in a Kafka log, so a record read
once is the record at that offset; a span records exactly the offsets one sequential read
consumed, so gaps (compacted topics) are gaps in the span too. Memory is bounded: a span drops its
oldest records past ``SPAN_MAX_BYTES``, and past ``TOTAL_MAX_BYTES`` the least recently used spans
go (of the least recently used partition first).

``max_bytes`` keeps :class:`RecordReader`'s rule: stop before a record that would exceed it,
except that the first record is always returned.

**The last answer, shared.** A record appended at a partition's end answers every long poll
waiting there with the same read — same ``(key, start, end, max_bytes)`` — thousands of times in
one key event. A read served wholly from a span is a function of those four (a span's offsets
hold what the log holds, for ever), so the last such answer is kept and returned again, the same
list object, without a walk of the span: the callers treat it as read-only (``PartitionRead``
shares it, and the service's rendered answers are keyed on it). It goes when its span is replaced
(a read or a push opening a span elsewhere past the partition's limit), as the span's records do.

Concurrency contract: thread-safe. The span table has its own lock, never held during a Kafka
read; two threads missing the same tail at once may both read it (both results are correct; the
span keeps one).
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from ..clients._clients import READ_TIMEOUT_S, FetchedRecord, RecordReader
from ..settings import KafkaSettings
from ._gathered import GatheredRecords
from ._keys import TopicPartitionKey

__all__ = ["SPANS_PER_PARTITION", "SPAN_MAX_BYTES", "TOTAL_MAX_BYTES", "SharedReadReader"]

SPAN_MAX_BYTES = 16 * 1024 * 1024  # one partition's span: the largest fetch the service allows
TOTAL_MAX_BYTES = 64 * 1024 * 1024  # all spans: a few hot partitions' recent records
SPANS_PER_PARTITION = 2  # a range readers come back to, and the tail's end (module docstring)


@dataclass
class _Span:
    start: int
    end: int  # exclusive: every offset in [start, end) was consumed by a read
    records: list[FetchedRecord] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # parallel to records, for bisect
    size: int = 0

    def extend(self, records: list[FetchedRecord]) -> None:
        for record in records:
            self.records.append(record)
            self.offsets.append(record.offset)
            self.size += record.size
        if records:
            self.end = records[-1].offset + 1

    def trim(self, max_bytes: int) -> int:
        """Drop the oldest records until the span holds at most ``max_bytes``; return bytes freed."""
        drop, freed = 0, 0
        while self.size - freed > max_bytes and drop < len(self.records) - 1:
            freed += self.records[drop].size
            drop += 1
        if drop:
            self.start = self.records[drop].offset
            del self.records[:drop], self.offsets[:drop]
            self.size -= freed
        return freed


def _covering(spans: list[_Span], offset: int, *, at_end: bool = False) -> _Span | None:
    """The first of ``spans`` holding ``offset`` (or, with ``at_end``, continued by it)."""
    for span in spans:
        if span.start <= offset < span.end or (at_end and offset == span.end):
            return span
    return None


class SharedReadReader(RecordReader):
    """A :class:`RecordReader` whose reads are shared through per-partition spans (module docstring)."""

    def __init__(
        self,
        settings: KafkaSettings | None = None,
        *,
        bootstrap_servers: str | None = None,
        total_max_bytes: int | None = None,
        gathered_max_bytes: int | None = None,
    ) -> None:
        super().__init__(settings, bootstrap_servers=bootstrap_servers)
        # Records fetches waiting for min_bytes keep past this cache's spans (_gathered): bounded
        # by gathered_max_bytes, or not counted at all (None: the library's default).
        self.gathered = GatheredRecords(gathered_max_bytes) if gathered_max_bytes is not None else None
        # All spans: TOTAL_MAX_BYTES unless a smaller cache is wanted (KafkaPurgatory's read-back).
        self._total_max = TOTAL_MAX_BYTES if total_max_bytes is None else total_max_bytes
        self._span_max = min(SPAN_MAX_BYTES, self._total_max)
        # Per partition its spans, most recently used first; partitions least recently used first.
        self._spans: OrderedDict[TopicPartitionKey, list[_Span]] = OrderedDict()
        self._spans_lock = threading.Lock()
        self._total = 0
        self.shared_hits = 0  # reads answered (at least in part) from a span
        self.kafka_reads = 0  # reads that went to Kafka
        self.pushed_records = 0  # records the change feed's tail handed in (append)
        self.repeated_reads = 0  # of those, answered with the last answer itself (module docstring)
        # (key, start, end, max_bytes, answer) of the last read served wholly from a span: one
        # tuple, stored and read in one step, so another thread sees all of it or none.
        self._last: tuple[TopicPartitionKey, int, int, int, list[FetchedRecord]] | None = None

    @property
    def cached_bytes(self) -> int:
        """Bytes of keys and values the spans hold now (at most the cache's total bound)."""
        return self._total

    def read(
        self,
        key: TopicPartitionKey,
        start: int,
        end: int,
        *,
        max_bytes: int,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> list[FetchedRecord]:
        if end <= start or start < 0:
            return super().read(key, start, end, max_bytes=max_bytes, timeout_s=timeout_s)
        last = self._last
        # Field by field: a slice and a tuple per read would be two allocations per long poll.
        if (
            last is not None
            and last[1] == start
            and last[2] == end
            and last[3] == max_bytes
            and last[0] == key
        ):
            self.shared_hits += 1
            self.repeated_reads += 1
            return last[4]
        out: list[FetchedRecord] = []
        used = 0
        resume = start
        with self._spans_lock:
            spans = self._spans.get(key)
            span = _covering(spans, start) if spans else None
            if spans is not None and span is not None:
                self._spans.move_to_end(key)
                if spans[0] is not span:
                    spans.remove(span)
                    spans.insert(0, span)
                self.shared_hits += 1
                for record in span.records[bisect.bisect_left(span.offsets, start) :]:
                    if record.offset >= end or (out and used + record.size > max_bytes):
                        self._last = (key, start, end, max_bytes, out)
                        return out
                    out.append(record)
                    used += record.size
                resume = span.end
                if resume >= end:
                    self._last = (key, start, end, max_bytes, out)
        if resume >= end:
            return out
        self.kafka_reads += 1
        fetched = super().read(key, resume, end, max_bytes=max(1, max_bytes - used), timeout_s=timeout_s)
        fetched = self._remember(key, resume, fetched)
        for record in fetched:
            if out and used + record.size > max_bytes:
                # Cut by max_bytes at a record read: the answer is complete, whatever the log
                # holds past it, so it is shared from now on (the next range read of a long
                # poll repeated against a client that never reads renders no new body).
                self._last = (key, start, end, max_bytes, out)
                break
            out.append(record)
            used += record.size
        return out

    def append(self, key: TopicPartitionKey, records: list[FetchedRecord]) -> None:
        """Records a sequential reader (the change feed's tail) fetched, contiguous from ``records[0]``.

        They continue the span whose range holds or ends at their first offset (the overlap is
        dropped: the same offsets hold the same records), and open a span otherwise, as a read
        elsewhere does.
        """
        if not records:
            return
        with self._spans_lock:
            spans = self._spans.get(key)
            span = _covering(spans, records[0].offset, at_end=True) if spans else None
            end = span.end if span is not None else None
        if end is not None:
            fresh = records[bisect.bisect_left([r.offset for r in records], end) :]
            self._remember(key, end, fresh)
        else:
            self._remember(key, records[0].offset, records)
        self.pushed_records += len(records)

    def _remember(
        self, key: TopicPartitionKey, start: int, fetched: list[FetchedRecord]
    ) -> list[FetchedRecord]:
        """Keep ``fetched`` (read from ``start``) in the partition's span; return the span's own
        records for those offsets.

        Readers that missed the same range at once (the first long polls of a cold partition,
        on the attempt threads) each read it from Kafka: their records are equal but other
        objects, and the answers rendered from them are keyed on the records' identity — 100
        polls of a 4 MB range were 100 bodies of ~5.4 MB, not one (the back-pressure report's
        h2c replay: +530 MB from a cold service). A read overlapping the span's end continues
        it, and every reader gets the span's objects for the offsets it already held.
        """
        if not fetched:
            return fetched
        with self._spans_lock:
            spans = self._spans.setdefault(key, [])
            span = _covering(spans, start, at_end=True)
            if span is not None:
                if span.end > start:
                    fetched_offsets = [r.offset for r in fetched]
                    fresh = fetched[bisect.bisect_left(fetched_offsets, span.end) :]
                else:
                    fresh = fetched  # the common case: the tail after the span's end
                before = span.size
                span.extend(fresh)
                self._total += span.size - before
                if fresh is not fetched:
                    lo = bisect.bisect_left(span.offsets, start)
                    fetched = span.records[lo : bisect.bisect_right(span.offsets, fetched[-1].offset, lo)]
                # Spans it grew over hold the same records again: they go.
                for other in [
                    s for s in spans if s is not span and span.start <= s.start and s.end <= span.end
                ]:
                    spans.remove(other)
                    self._total -= other.size
                if spans[0] is not span:
                    spans.remove(span)
                    spans.insert(0, span)
            else:
                span = _Span(start, start)
                span.extend(fetched)
                spans.insert(0, span)
                self._total += span.size
                if len(spans) > SPANS_PER_PARTITION:
                    self._drop_oldest(key, spans)
            self._spans.move_to_end(key)
            self._total -= span.trim(self._span_max)
            # The least recently used spans go first; never the one just written (it is the
            # first of the most recently used partition).
            while self._total > self._total_max and (len(self._spans) > 1 or len(spans) > 1):
                oldest_key, oldest = next(iter(self._spans.items()))
                self._drop_oldest(oldest_key, oldest)
        return fetched

    def _drop_oldest(self, key: TopicPartitionKey, spans: list[_Span]) -> None:
        """Drop the least recently used span of ``key`` (the caller holds the span table's lock)."""
        dropped = spans.pop()
        self._total -= dropped.size
        if not spans:
            del self._spans[key]
        last = self._last
        if last is not None and last[0] == key:
            self._last = None  # a span of its partition went: so may what it read (module docstring)
