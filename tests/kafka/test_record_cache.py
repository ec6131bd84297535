"""SharedReadReader: reads shared through per-partition spans give exactly what a direct read gives.

The Kafka read underneath is replaced by a fake log (our own port: ``RecordReader.read``), so the
span arithmetic is checked without a cluster, including compacted logs (gaps in offsets),
``max_bytes`` cuts and eviction; one test compares with direct reads on the real Kafka.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from purgatory.adapters.kafka import (
    FetchedRecord,
    ProducerRecord,
    RecordReader,
    SharedReadReader,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.facts import _record_cache
from purgatory.adapters.kafka.settings import KafkaSettings

from tests.kafka.kafka_fixtures import RecordAppender, TopicFactory

KEY = TopicPartitionKey("t", 0)


def _log(offsets: list[int], size: int = 10) -> list[FetchedRecord]:
    return [FetchedRecord(o, None, b"v" * size, 0) for o in offsets]


def _direct(log: list[FetchedRecord], start: int, end: int, max_bytes: int) -> list[FetchedRecord]:
    """RecordReader's contract on a log: offsets in [start, end), cut before exceeding max_bytes (>= 1)."""
    out: list[FetchedRecord] = []
    used = 0
    for record in log:
        if record.offset < start or record.offset >= end:
            continue
        if out and used + record.size > max_bytes:
            break
        out.append(record)
        used += record.size
    return out


@pytest.fixture
def fake_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FetchedRecord]]:
    log: list[FetchedRecord] = []

    def read(
        self: RecordReader,
        key: TopicPartitionKey,
        start: int,
        end: int,
        *,
        max_bytes: int,
        timeout_s: float = 2.0,
    ) -> list[FetchedRecord]:
        return _direct(log, start, end, max_bytes)

    monkeypatch.setattr(RecordReader, "read", read)
    yield log


def test_polls_at_the_same_offset_share_one_kafka_read(fake_log: list[FetchedRecord]) -> None:
    fake_log += _log(list(range(5)))
    reader = SharedReadReader(KafkaSettings(bootstrap_servers="unused:9092"))
    results = [reader.read(KEY, 2, 5, max_bytes=1 << 20) for _ in range(100)]
    assert all(r == fake_log[2:5] for r in results)
    assert reader.kafka_reads == 1 and reader.shared_hits == 99


def test_the_waiters_of_one_key_event_get_the_very_same_list(fake_log: list[FetchedRecord]) -> None:
    """A burst of equal reads (10,000 long polls woken by one record) shares one answer object:
    the service renders one body per list (before equal long polls shared one operation)."""
    fake_log += _log(list(range(5)))
    reader = SharedReadReader(KafkaSettings(bootstrap_servers="unused:9092"))
    reader.read(KEY, 0, 5, max_bytes=1 << 20)  # fills the span from "Kafka"
    first = reader.read(KEY, 2, 5, max_bytes=1 << 20)
    again = [reader.read(KEY, 2, 5, max_bytes=1 << 20) for _ in range(50)]
    assert all(r is first for r in again), "an equal read served from the span is the same list"
    assert first == fake_log[2:5]
    assert reader.repeated_reads == 50
    assert reader.read(KEY, 2, 5, max_bytes=15) == fake_log[2:3], "another max_bytes is its own read"
    assert reader.read(KEY, 2, 4, max_bytes=1 << 20) == fake_log[2:4], "another end is its own read"


def test_a_range_read_again_after_the_tail_pushed_elsewhere_is_served_from_memory(
    fake_log: list[FetchedRecord],
) -> None:
    """Issue 31, item 6: readers of a range behind the end and the tail's push of the record
    below the end (``read_last``) each keep their span; the range's next read is the same list
    (one rendered body), not a Kafka read and a new body."""
    fake_log += _log(list(range(60)))
    reader = SharedReadReader(KafkaSettings(bootstrap_servers="unused:9092"))
    reader.read(KEY, 0, 60, max_bytes=400)  # records 0-39, from "Kafka"
    reader.append(KEY, fake_log[59:60])  # the tail starts following the partition
    # Records 0-39 from the span, record 40 from "Kafka" proves the cut: shared from now on.
    shared = reader.read(KEY, 0, 60, max_bytes=400)
    assert shared == fake_log[0:40] and reader.kafka_reads == 2
    again = reader.read(KEY, 0, 60, max_bytes=400)
    assert again is shared and reader.kafka_reads == 2
    assert reader.read(KEY, 59, 60, max_bytes=400) == fake_log[59:60] and reader.kafka_reads == 2, (
        "the pushed record is served from its own span"
    )
    reader.append(KEY, fake_log[41:45])  # continues the first span (0-40)
    assert reader.read(KEY, 0, 45, max_bytes=1 << 20) == fake_log[0:45] and reader.kafka_reads == 2


def test_a_dropped_span_forgets_the_answer_it_gave(fake_log: list[FetchedRecord]) -> None:
    """The last answer lives no longer than its span: once the span is dropped (the tail or
    reads opening spans elsewhere past SPANS_PER_PARTITION), an equal read is read again, not
    repeated."""
    fake_log += _log(list(range(5)))
    reader = SharedReadReader(KafkaSettings(bootstrap_servers="unused:9092"))
    reader.read(KEY, 0, 5, max_bytes=1 << 20)  # fills the span from "Kafka"
    old = reader.read(KEY, 0, 3, max_bytes=1 << 20)
    assert reader.read(KEY, 0, 3, max_bytes=1 << 20) is old
    assert _record_cache.SPANS_PER_PARTITION == 2
    reader.append(KEY, _log([7, 8]))  # not contiguous with the span: a second span
    reader.append(KEY, _log([20, 21]))  # a third: the least recently used one goes
    repeated = reader.repeated_reads
    got = reader.read(KEY, 0, 3, max_bytes=1 << 20)
    assert got is not old and got == fake_log[0:3], "read again after the span went"
    assert reader.repeated_reads == repeated


def test_a_read_past_the_span_fetches_only_the_missing_tail(fake_log: list[FetchedRecord]) -> None:
    fake_log += _log(list(range(10)))
    reader = SharedReadReader(KafkaSettings(bootstrap_servers="unused:9092"))
    assert reader.read(KEY, 0, 4, max_bytes=1 << 20) == fake_log[0:4]
    calls: list[tuple[int, int]] = []
    inner = RecordReader.read

    def spy(
        self: RecordReader, key: TopicPartitionKey, start: int, end: int, **kw: object
    ) -> list[FetchedRecord]:
        calls.append((start, end))
        return inner(self, key, start, end, **kw)  # type: ignore[arg-type]

    RecordReader.read = spy  # type: ignore[method-assign]  # undone by the fixture's monkeypatch
    assert reader.read(KEY, 2, 10, max_bytes=1 << 20) == fake_log[2:10]
    assert calls == [(4, 10)], "records 2 and 3 came from the span"


@settings(max_examples=300, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 60), min_size=1, max_size=40, unique=True).map(sorted),
    reads=st.lists(
        st.tuples(st.integers(0, 65), st.integers(0, 70), st.integers(1, 120)), min_size=1, max_size=25
    ),
    sizes=st.lists(st.integers(1, 40), min_size=40, max_size=40),
)
def test_shared_reads_equal_direct_reads_on_any_log(
    offsets: list[int], reads: list[tuple[int, int, int]], sizes: list[int]
) -> None:
    """Any sequence of reads, on a log with gaps (compaction), returns what a direct read would."""
    log = [FetchedRecord(o, None, b"v" * s, 0) for o, s in zip(offsets, sizes, strict=False)]
    original = RecordReader.read

    def read(
        self: RecordReader, key: TopicPartitionKey, start: int, end: int, **kw: int
    ) -> list[FetchedRecord]:
        return _direct(log, start, end, kw["max_bytes"])

    RecordReader.read = read  # type: ignore[method-assign,assignment]
    try:
        reader = SharedReadReader(KafkaSettings(bootstrap_servers="unused:9092"))
        for start, end, max_bytes in reads:
            assert reader.read(KEY, start, end, max_bytes=max_bytes) == _direct(log, start, end, max_bytes), (
                f"read({start}, {end}, max_bytes={max_bytes})"
            )
    finally:
        RecordReader.read = original  # type: ignore[method-assign]


def test_memory_stays_bounded(fake_log: list[FetchedRecord], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_record_cache, "SPAN_MAX_BYTES", 100)
    monkeypatch.setattr(_record_cache, "TOTAL_MAX_BYTES", 250)
    fake_log += _log(list(range(50)))  # 10 bytes each
    reader = SharedReadReader(KafkaSettings(bootstrap_servers="unused:9092"))
    assert reader.read(KEY, 0, 50, max_bytes=1 << 20) == fake_log
    assert reader._spans[KEY][0].size <= 100, "a span keeps only its newest records"
    for partition in range(1, 6):
        reader.read(TopicPartitionKey("t", partition), 0, 50, max_bytes=1 << 20)
    assert (
        reader._total <= 250
        and sum(s.size for spans in reader._spans.values() for s in spans) == reader._total
    )
    assert reader.read(KEY, 0, 50, max_bytes=1 << 20) == fake_log, "evicted spans are read again"


@pytest.mark.kafka
def test_shared_reads_equal_direct_reads_on_real_kafka(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    key = TopicPartitionKey(topic, 0)
    producer = RecordAppender(kafka_settings)
    direct, shared = RecordReader(kafka_settings), SharedReadReader(kafka_settings)
    try:
        producer.produce([ProducerRecord(topic, f"value-{i}".encode(), partition=0) for i in range(30)])
        for start, end, max_bytes in [
            (0, 10, 1 << 20),
            (5, 30, 40),
            (5, 30, 1 << 20),
            (29, 30, 1),
            (12, 20, 16),
        ]:
            assert shared.read(key, start, end, max_bytes=max_bytes) == direct.read(
                key, start, end, max_bytes=max_bytes
            )
        assert shared.shared_hits >= 3 and shared.kafka_reads <= 3
    finally:
        producer.close()
        direct.close()
        shared.close()


def test_the_reader_asks_the_broker_not_to_hold_its_fetches() -> None:
    """A read's range exists, but librdkafka prefetches past the record a read stops at; the
    broker held that fetch for fetch.wait.max.ms and the next read's fetch queued behind it
    (~12 ms per read with 10 ms, ~0.5 ms with 0: debug=fetch, ``purgatory bench produce``)."""
    config = RecordReader(KafkaSettings(bootstrap_servers="127.0.0.1:1")).consumer_config()
    assert int(config["fetch.wait.max.ms"]) == 0
