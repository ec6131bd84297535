"""RecordReader's reads of a range known to exist, against a fake consumer (no cluster).

The fake plays librdkafka's side: what each ``consume`` call returns, and the high watermark of
the last fetch response (``get_watermark_offsets(cached=True)``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import pytest
from confluent_kafka import KafkaError
from purgatory.adapters.kafka import ProducerRecord, RecordReader, TopicPartitionKey
from purgatory.adapters.kafka.clients._clients import LOG_END
from purgatory.adapters.kafka.settings import KafkaSettings

from tests.kafka.kafka_fixtures import WAIT_S, RecordAppender, TopicFactory

KEY = TopicPartitionKey("t", 0)
SHORT_S = 0.05  # a read that must end by its deadline: short, the fake answers at once
LONG_READ_S = 20.0  # a deadline far past any read of a few records: ending at it is the bug


class _Message:
    def __init__(self, offset: int, eof: bool = False) -> None:
        self._offset = offset
        self._eof = eof

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000 + self._offset)


class _FakeConsumer:
    """Each consume() returns the next scripted batch (then nothing); ``highs`` the broker's high
    watermark as of each batch (the last one stays)."""

    def __init__(self, batches: list[list[_Message]], highs: list[int]) -> None:
        self.batches = deque(batches)
        self.highs = deque(highs)
        self.high = highs[0]
        self.consumes = 0
        self.queries = 0  # get_watermark_offsets asked of the broker (not librdkafka's cache)

    def assign(self, partitions: Any) -> None:
        pass

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        self.consumes += 1
        if self.highs:
            self.high = self.highs.popleft()
        return self.batches.popleft() if self.batches else []

    def get_watermark_offsets(
        self, partition: Any, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        if not cached:  # a read to LOG_END asks the broker where the end is, once
            self.queries += 1
        return 0, self.high

    def close(self) -> None:
        pass


def _reader(consumer: _FakeConsumer) -> RecordReader:
    reader = RecordReader(KafkaSettings(bootstrap_servers="127.0.0.1:9"))
    reader._consumer = consumer  # type: ignore[assignment]
    return reader


def test_an_end_of_log_below_the_known_high_watermark_does_not_end_the_read() -> None:
    """Right after a leader change the new leader's high watermark (1) lags the one the long poll
    saw (3): its end of log at 1 must not answer the read with what it has; the records come."""
    consumer = _FakeConsumer(
        [[_Message(0), _Message(1, eof=True)], [_Message(1), _Message(2)]],
        highs=[1, 3],
    )
    reader = _reader(consumer)
    records = reader.read(KEY, 0, 3, max_bytes=1 << 20)
    assert [r.offset for r in records] == [0, 1, 2], "the whole range known to exist"
    assert reader.stalled_reads == 0


def test_a_lagging_leader_that_does_not_catch_up_ends_the_read_by_its_deadline_not_as_stalled() -> None:
    consumer = _FakeConsumer([[_Message(0, eof=True)]], highs=[0])
    reader = _reader(consumer)
    assert reader.read(KEY, 0, 3, max_bytes=1 << 20, timeout_s=SHORT_S) == []
    assert consumer.consumes > 1, "it kept fetching after the short end of log"
    assert reader.stalled_reads == 0 and KEY not in reader._stalled, (
        "the broker answered: the partition's next reads still go to Kafka"
    )


def test_an_end_of_log_at_the_high_watermark_ends_the_read_at_once() -> None:
    """Offset 2 is a transaction marker (not delivered): the end of log at 3 = the broker's high
    watermark = the range's end, so the read is complete with 0 and 1."""
    consumer = _FakeConsumer([[_Message(0), _Message(1), _Message(3, eof=True)]], highs=[3])
    reader = _reader(consumer)
    assert [r.offset for r in reader.read(KEY, 0, 3, max_bytes=1 << 20)] == [0, 1]
    assert consumer.consumes == 1, "no second fetch"


def test_a_read_to_the_log_end_ends_at_the_end_of_log() -> None:
    consumer = _FakeConsumer([[_Message(0), _Message(1, eof=True)]], highs=[1])
    reader = _reader(consumer)
    assert [r.offset for r in reader.read(KEY, 0, LOG_END, max_bytes=1 << 20)] == [0]
    assert (consumer.consumes, consumer.queries) == (1, 1), "the end asked once, then read up to it"


def test_a_read_to_the_log_end_at_the_end_is_one_query_and_no_consume() -> None:
    # A fetch that does not wait, at the end of the log (the common case): consuming until the
    # end-of-log event waited a whole consume slice (20 ms) per read.
    consumer = _FakeConsumer([[_Message(5, eof=True)]], highs=[5])
    reader = _reader(consumer)
    assert reader.read(KEY, 5, LOG_END, max_bytes=1 << 20) == []
    assert (consumer.consumes, consumer.queries, reader.stalled_reads) == (0, 1, 0)


@pytest.mark.kafka
def test_a_read_to_the_log_end_of_a_real_partition_ends_at_its_end_not_its_deadline(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    """An expiring long poll that knows no high watermark reads to LOG_END (DelayedFetch
    ._read_unreported) on the finishing thread: librdkafka's consume() waits for as many events as
    asked (500), so the read used to end at its deadline, the end of log in hand."""
    topic = kafka_topic_factory(1, prefix="log-end")
    key = TopicPartitionKey(topic, 0)
    producer = RecordAppender(kafka_settings)
    reader = RecordReader(kafka_settings)
    try:
        producer.produce([ProducerRecord(topic, b"v%d" % i, None, 0) for i in range(3)], WAIT_S)
        assert [r.offset for r in reader.read(key, 0, 3, max_bytes=1 << 20)] == [0, 1, 2]  # connected
        started = time.monotonic()
        records = reader.read(key, 1, LOG_END, max_bytes=1 << 20, timeout_s=LONG_READ_S)
        elapsed = time.monotonic() - started
        assert [r.offset for r in records] == [1, 2]
        assert elapsed < LONG_READ_S / 2, f"ended by its deadline ({elapsed:.1f} s), not at the end of log"
        assert reader.stalled_reads == 0
    finally:
        reader.close()
        producer.close()
