"""DelayedFetch: a fetch waits until enough bytes arrived past its offsets (Kafka's DelayedFetch).

Each partition of the fetch is a :class:`PartitionRead` (where it reads from, what it read, how it
ended). Its variants sit beside it: ``_off_loop`` (completed on the event loop's thread); the
service's HTTP wrappers build on it. The base contract is :class:`KafkaOperation`'s (``_operations``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from ..clients._clients import LOG_END, FetchedRecord, RecordReader
from ..clients._errors import InvalidOffsetError, KafkaAdapterError, KafkaUnavailableError
from ..facts._facts import FactSource
from ..facts._gathered import POINTER_BYTES, GatheredRecords, Holding
from ..facts._keys import KafkaKey, TopicPartitionKey
from ..facts._record_cache import SharedReadReader
from ._operations import (
    KafkaOperation,
    _require_offsets,
)
from ._results import (
    ErrorCode,
    FetchResult,
)

__all__ = ["DelayedFetch", "PartitionRead"]


DEFAULT_FETCH_MAX_BYTES = 1 << 20  # Kafka's fetch.max.bytes per partition default is 1 MiB


_LOG_END = LOG_END  # an end offset past any log: read up to what the partition holds


class PartitionRead:
    """One partition of a :class:`DelayedFetch`: where it reads from, what it read, how it ended.

    A waiting long poll is held by the thousands (50,000 per service process, issue 12): one
    slotted object per partition instead of six per-operation dicts keyed by partition (~1.5 KB
    of a one-partition fetch's ~2.5 KB, measured with tracemalloc). ``records`` stays the shared
    empty tuple until something is read.
    """

    __slots__ = (
        "bytes_read",
        "checked_end",
        "fetch_offset",
        "high_watermark",
        "key",
        "read_from",
        "records",
        "status",
    )

    def __init__(self, key: TopicPartitionKey, fetch_offset: int) -> None:
        self.key = key
        self.fetch_offset = fetch_offset
        self.read_from = fetch_offset  # the next offset to read (each byte is read once)
        self.bytes_read = 0
        self.high_watermark: int | None = None  # last one checked in range (None: not known yet)
        self.records: Sequence[FetchedRecord] = ()  # a list once something was read
        self.status = ErrorCode.NONE
        # A high watermark Kafka itself gave (ListOffsets) after the facts were read, when the
        # caller checked an offset past the facts' end (-1: none). Facts below it lag: the
        # fetch waits for them rather than answering OFFSET_OUT_OF_RANGE (DelayedFetch.try_complete).
        self.checked_end = -1

    def add(self, batch: list[FetchedRecord]) -> int:
        """Keep ``batch`` (read at ``read_from``) and move past it.

        ``batch`` is kept as it is, never changed: the shared record cache hands every long poll
        of a key event the same list (SharedReadReader, "the last answer, shared"), and the
        service renders one answer per list. A second read makes a new list. Returns the
        batch's bytes of keys and values.
        """
        self.records = [*self.records, *batch] if self.records else batch
        size = _size_of(batch)
        self.bytes_read += size
        self.read_from = batch[-1].offset + 1
        return size


# The last batch sized by _size_of and its size: a key event adds the same batch to thousands of
# reads. One tuple, stored and read in one step (threads: the feed's, the timer's executor).
_last_sized: tuple[list[FetchedRecord], int] | None = None


def _size_of(batch: list[FetchedRecord]) -> int:
    global _last_sized
    last = _last_sized
    if last is not None and last[0] is batch:
        return last[1]
    size = sum(r.size for r in batch)
    _last_sized = (batch, size)
    return size


def _partition_reads(fetch_offsets: Mapping[TopicPartitionKey, int]) -> tuple[PartitionRead, ...]:
    return tuple(
        PartitionRead(key, offset)
        for key, offset in _require_offsets("DelayedFetch.fetch_offsets", fetch_offsets).items()
    )


class DelayedFetch(KafkaOperation):
    """Long poll: completes when the partitions hold enough past the fetch offsets, or at ``max_wait_ms``.

    Enough means ``min_records`` records in total (counted from high watermarks, no reads), or,
    when ``min_bytes`` is given, at least that many bytes of keys and values — read
    incrementally through ``reader`` as the high watermarks move (each byte is read once).
    A fetch offset below the log start or above the high watermark finishes the fetch at once
    with ``OFFSET_OUT_OF_RANGE`` and an :class:`InvalidOffsetError` (Kafka's behaviour); an
    unknown partition with ``UNKNOWN_TOPIC_OR_PARTITION``. ``records`` holds what was read per
    partition (on expiry: whatever had arrived), at most ``max_bytes`` per partition. What a fetch
    holds while it waits for ``min_bytes`` counts against its reader's :class:`GatheredRecords`
    when it has one (``SharedReadReader(gathered_max_bytes=)``): a fetch whose next read would
    pass that bound is answered at once, with what it has (``facts/_gathered.py``).

    Attributes:
        parts: one :class:`PartitionRead` per partition, in the order given (key, fetch offset,
            status, records): what the service reads when it answers.
        fetch_offsets: the offset each partition is read from (a new dict per read).
        records: records read per partition (a new dict of new lists per read).
        statuses: per partition: ``NONE``, ``OFFSET_OUT_OF_RANGE`` or ``UNKNOWN_TOPIC_OR_PARTITION``
            (a new dict per read).

    ``result()`` returns these as a :class:`FetchResult` once finished.
    """

    __slots__ = ("gathered", "max_bytes", "min_bytes", "min_records", "parts", "reader")

    needs_log_start = True  # a fetch offset below the log start is out of range

    def __init__(
        self,
        facts: FactSource,
        reader: RecordReader,
        fetch_offsets: Mapping[TopicPartitionKey, int],
        *,
        min_records: int = 1,
        min_bytes: int | None = None,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        max_wait_ms: int | None = None,
        on_response: Callable[[KafkaOperation], None] | None = None,
    ) -> None:
        super().__init__(
            max_wait_ms if max_wait_ms is not None else facts.settings.fetch_max_wait_ms,
            facts,
            on_response=on_response,
        )
        if isinstance(min_records, bool) or not isinstance(min_records, int) or min_records < 0:
            raise ValueError(f"min_records must be an int >= 0, got {min_records!r}")
        if min_bytes is not None and (not isinstance(min_bytes, int) or min_bytes < 0):
            raise ValueError(f"min_bytes must be an int >= 0 or None, got {min_bytes!r}")
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be an int > 0, got {max_bytes!r}")
        self.reader = reader
        self.parts = _partition_reads(fetch_offsets)
        self.min_records = min_records
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        # What it took from the reader's GatheredRecords while waiting for min_bytes (_hold).
        self.gathered: Holding | None = None

    @property
    def fetch_offsets(self) -> dict[TopicPartitionKey, int]:
        return {part.key: part.fetch_offset for part in self.parts}

    @property
    def records(self) -> dict[TopicPartitionKey, list[FetchedRecord]]:
        return {part.key: list(part.records) for part in self.parts}

    @property
    def statuses(self) -> dict[TopicPartitionKey, ErrorCode]:
        return {part.key: part.status for part in self.parts}

    def watch_keys(self) -> tuple[KafkaKey, ...]:
        return tuple(part.key for part in self.parts)

    def past_the_facts(self) -> list[TopicPartitionKey]:
        """Partitions whose fetch offset is past the high watermark the facts report now.

        The facts lag Kafka by a few ms (the feed reports an append after its produce was
        answered), so such an offset may be the log's end. Whoever submits the fetch may ask
        Kafka (ListOffsets) and hand the ends to :meth:`checked_ends` before submitting it:
        then the fetch waits for the facts rather than answering ``OFFSET_OUT_OF_RANGE``.
        """
        out = []
        for part in self.parts:
            facts = self.facts.partition(part.key)
            high = None if facts is None or facts.error is not None else facts.high_watermark
            if high is not None and part.fetch_offset > high:
                out.append(part.key)
        return out

    def checked_ends(self, high_watermarks: Mapping[TopicPartitionKey, int]) -> None:
        """High watermarks Kafka gave for :meth:`past_the_facts`'s partitions (before submitting)."""
        for part in self.parts:
            high = high_watermarks.get(part.key)
            if high is not None:
                part.checked_end = high

    def try_complete(self) -> bool:
        available = 0
        known = 0
        for part in self.parts:
            key, offset = part.key, part.fetch_offset
            facts = self.facts.partition(key)
            if facts is None:
                continue
            if facts.error is not None:
                if facts.error.kind == "unknown_topic":
                    part.status = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    return self._fail(facts.error.to_exception())
                continue
            high, start = facts.high_watermark, facts.log_start_offset
            if high is None:
                continue
            if offset > high or (start is not None and offset < start):
                if high < offset <= part.checked_end:
                    # The facts lag an end Kafka gave since (a produce answered a moment ago,
                    # its append not reported yet): the offset is in range; wait for the facts.
                    continue
                part.status = ErrorCode.OFFSET_OUT_OF_RANGE
                return self._fail(
                    InvalidOffsetError(
                        f"fetch offset {offset} of {key.label} is out of range "
                        f"[log start {start}, high watermark {high}]"
                    )
                )
            part.high_watermark = high
            available += high - offset
        for part in self.parts:
            if part.high_watermark is not None:
                known += 1
        if known < len(self.parts):
            # Not every partition's range is known (or checked) yet: Kafka answers a fetch only
            # once each partition's offset was validated, even with min_bytes=0.
            enough_known = available >= self.min_records > 0 if self.min_bytes is None else False
            return self.force_complete() if enough_known else False
        if self.min_bytes is None:
            return self.force_complete() if available >= self.min_records else False
        fresh: list[tuple[list[FetchedRecord], int]] = []
        if self._read_new(fresh) >= self.min_bytes:
            return self.force_complete()
        # Short of min_bytes: it waits on, holding what it read. Past the process's bound on
        # such records it is answered now, with what it has (Kafka's answer to a fetch that
        # cannot grow); the records read are its answer then, not gathered ones.
        return self.force_complete() if fresh and not self._hold(fresh) else False

    def _read_new(self, fresh: list[tuple[list[FetchedRecord], int]] | None = None) -> int:
        """Read what arrived since the last read, up to ``max_bytes`` per partition; total bytes held.

        Each batch read and its size go to ``fresh`` when given.
        """
        total = 0
        for part in self.parts:
            high, start = part.high_watermark, part.read_from
            room = self.max_bytes - part.bytes_read
            if high is not None and high > start and room > 0:
                batch = self.reader.read(part.key, start, high, max_bytes=room)
                if batch:
                    size = part.add(batch)
                    if fresh is not None:
                        fresh.append((batch, size))
            total += part.bytes_read
        return total

    def _hold(self, fresh: list[tuple[list[FetchedRecord], int]]) -> bool:
        """Count ``fresh`` in the reader's :class:`GatheredRecords` (if it has one); False if refused.

        The holding is stored before the finished check: ``on_complete`` (which may run on the
        timer's thread now, without ``op.lock``) either sees it and gives it back — a take after
        that is refused — or ran before the store, and then this sees the op finished.
        """
        ledger = self._ledger()
        if ledger is None:
            return True
        holding = self.gathered
        if holding is None:
            holding = self.gathered = Holding()
        if self.is_completed():
            return True  # finished meanwhile: it holds nothing for long
        taken = [(batch, GatheredRecords.cost(batch, size)) for batch, size in fresh]
        return ledger.take(holding, taken, POINTER_BYTES * self._own_references(holding, fresh))

    def _own_references(self, holding: Holding, fresh: list[tuple[list[FetchedRecord], int]]) -> int:
        """References in this fetch's own lists: a partition's records joined from two batches or more."""
        own = 0
        for part in self.parts:
            records = part.records
            if (
                records
                and not any(records is b for b in holding.batches)
                and not any(records is b for b, _ in fresh)
            ):
                own += len(records)
        return own

    def on_complete(self) -> None:
        self._give_back_gathered()  # it waited for min_bytes holding records: they are answers now
        super().on_complete()

    def on_refused(self) -> None:
        # The first try of a refused submission may have taken gathered bytes (min_bytes): no
        # finish will give them back, and the budget would shrink by them for good.
        self._give_back_gathered()

    def _give_back_gathered(self) -> None:
        holding = self.gathered
        ledger = self._ledger()
        if holding is not None and ledger is not None:
            ledger.give_back(holding)  # once: a holding given back stays so

    def _ledger(self) -> GatheredRecords | None:
        """The reader's bound on gathered records (only a SharedReadReader has one, if given)."""
        reader = self.reader
        return reader.gathered if isinstance(reader, SharedReadReader) else None

    def _respond_moved(self) -> None:
        for part in self.parts:  # NONE here means "no error yet", not "answered"
            part.status = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def _status_keys(self) -> Iterable[TopicPartitionKey]:
        return [part.key for part in self.parts]

    def _set_status(self, key: TopicPartitionKey | None, code: ErrorCode) -> None:
        for part in self.parts:
            if part.key == key:
                part.status = code

    def _read_unreported(self) -> None:
        """Read what the log holds now for partitions the feed has not reported yet.

        A fetch that expires before the feed's first poll of its partition (``max_wait_ms`` 0 or
        a few ms) knows no high watermark there, so ``_read_new`` reads nothing — yet Kafka's
        fetch with ``max_wait_ms`` 0 answers with the records already there. The consumer never
        reads past the high watermark, so "to the end of the log" is the bound; ``max_bytes``
        and the read's timeout bound the rest. (An offset out of range reads nothing here; the
        caller's range check answers it.)
        """
        for part in self.parts:
            if part.high_watermark is not None or part.status is not ErrorCode.NONE:
                continue
            if self.facts.partition(part.key) is not None:
                continue  # reported, with an error or no high watermark: nothing known to read
            self._read_to_end(part)

    def _read_to_log_end(self) -> None:
        """A fetch that does not wait reads what the log holds now, past any reported high watermark.

        Kafka answers ``max_wait_ms`` 0 with one read of the log: a record whose ``acks=all``
        produce was answered is in it. The feed reports an append a few ms after it, so a read
        bounded by the facts answered empty a poll sent right after the produce's answer (read
        your own write), on the fast path more often than through ASGI. A waiting fetch needs no
        such read: the feed's report of the append completes it. The consumer never reads past
        the high watermark; a partition reported with an error is not read (the read would wait
        out its timeout on it); ``max_bytes`` bounds the rest, as in :meth:`_read_unreported`.
        """
        for part in self.parts:
            if part.status is not ErrorCode.NONE:
                continue
            facts = self.facts.partition(part.key)
            if facts is not None and facts.error is not None:
                continue
            self._read_to_end(part)

    def _read_to_end(self, part: PartitionRead) -> None:
        """Read ``part`` from where it stopped to the log's end, within its room under ``max_bytes``."""
        room = self.max_bytes - part.bytes_read
        if room > 0:
            batch = self.reader.read(part.key, part.read_from, _LOG_END, max_bytes=room)
            if batch:
                part.add(batch)

    def _respond(self) -> None:
        if self.shutting_down or isinstance(self.error, KafkaUnavailableError):
            # Nothing decided these partitions (the records read so far stay): say why. Reading
            # on would stall the finishing thread on an unreachable cluster or a closing one.
            undecided = self._undecided_status()
            for part in self.parts:
                if part.status is ErrorCode.NONE:
                    part.status = undecided
            return
        if self.error is not None or self.facts.unavailable:
            return  # reading from an unreachable cluster would only stall the finishing thread
        try:
            # Expiry runs without op.lock; the feed thread may be reading in try_complete.
            with self.lock:
                if self.delay_ms == 0:
                    self._read_to_log_end()
                else:
                    self._read_new()
                    self._read_unreported()
        except KafkaAdapterError as exc:
            self.error = exc

    def result(self) -> FetchResult:
        """The finished operation's answer (raises ``RuntimeError`` before it finished)."""
        outcome = self._finished_outcome()
        return FetchResult(outcome, self.records, self.statuses, self.error)
