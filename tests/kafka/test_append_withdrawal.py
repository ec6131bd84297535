"""RecordProducer withdraws a request's queued records once one record's outcome is unknown.

No broker: librdkafka's producer is replaced by a fake that queues, reports in order and purges
as librdkafka does (purged records reported ``_PURGE_QUEUE`` on a later poll). The real fault —
a leader frozen past the request's timeout, whose socket still holds the lost batch — is
tests/kafka/test_replication.py's frozen-leader case (it failed 1 run in ~4 before the change).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError
from purgatory.adapters.kafka import AppendOutcomeUnknownError, ProducerRecord, RecordProducer
from purgatory.adapters.kafka._errors import KafkaUnavailableError

from purgatory.settings import KafkaSettings

TOPIC = "orders"


class _Message:
    def __init__(self, partition: int, offset: int, value: bytes | None) -> None:
        self._partition, self._offset, self._value = partition, offset, value

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


class FakeProducer:
    """Queues every record; each poll reports the next one: acknowledged, or ``outcomes``' error."""

    def __init__(self, outcomes: dict[int, int]) -> None:
        self.outcomes = outcomes  # record index -> KafkaError code
        self.queued: deque[tuple[int, bytes | None, Callable[..., None]]] = deque()
        self.reports: deque[tuple[KafkaError | None, _Message, Callable[..., None]]] = deque()
        self.produced = 0
        self.purges: list[dict[str, bool]] = []

    def produce(
        self, topic: str, value: bytes | None, key: Any = None, partition: int = 0, **kw: Any
    ) -> None:
        self.queued.append((self.produced, value, kw["on_delivery"]))
        self.produced += 1

    def poll(self, timeout: float) -> int:
        if not self.reports and self.queued:  # the next queued record goes out and is answered
            index, value, callback = self.queued.popleft()
            code = self.outcomes.get(index)
            self.reports.append((KafkaError(code) if code else None, _Message(0, index, value), callback))
        if self.reports:
            error, message, callback = self.reports.popleft()
            callback(error, message)
            return 1
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.purges.append({"in_queue": in_queue, "in_flight": in_flight})
        while self.queued:  # reported later, from a poll, as librdkafka does
            index, value, callback = self.queued.popleft()
            self.reports.append((KafkaError(KafkaError._PURGE_QUEUE), _Message(0, index, value), callback))


def _producer(fake: FakeProducer) -> RecordProducer:
    producer = RecordProducer(KafkaSettings(bootstrap_servers="127.0.0.1:1"))
    producer._producer = fake  # type: ignore[assignment]
    return producer


def _records(n: int) -> list[ProducerRecord]:
    return [ProducerRecord(TOPIC, b"%d" % i, partition=0) for i in range(n)]


def test_an_unknown_outcome_withdraws_the_records_queued_behind_it_and_counts_them_not_appended() -> None:
    fake = FakeProducer({3: KafkaError._MSG_TIMED_OUT})
    with pytest.raises(AppendOutcomeUnknownError) as info:
        _producer(fake).produce_identified(_records(10), timeout_s=5)
    assert fake.purges == [{"in_queue": True, "in_flight": False}], "purged once, never what is in flight"
    error = info.value
    assert (error.acknowledged, error.unknown, error.refused) == (3, 1, 6), str(error)
    assert "6 not appended" in str(error)


def test_a_refusal_withdraws_nothing_and_a_lone_records_unknown_outcome_purges_nothing() -> None:
    # A refusal (nothing appended) cannot be overtaken: the rest of the request goes on.
    refused = FakeProducer({3: KafkaError.MSG_SIZE_TOO_LARGE})
    with pytest.raises(AppendOutcomeUnknownError) as info:
        _producer(refused).produce_identified(_records(10), timeout_s=5)
    assert refused.purges == []
    assert (info.value.acknowledged, info.value.unknown, info.value.refused) == (9, 0, 1)
    # The last record's outcome unknown, nothing behind it: no purge (other requests keep theirs).
    last = FakeProducer({9: KafkaError._TIMED_OUT})
    with pytest.raises(AppendOutcomeUnknownError) as info:
        _producer(last).produce_identified(_records(10), timeout_s=5)
    assert last.purges == []
    assert (info.value.acknowledged, info.value.unknown, info.value.refused) == (9, 1, 0)


def test_a_record_withdrawn_for_another_requests_fault_is_a_typed_retriable_refusal() -> None:
    fake = FakeProducer({0: KafkaError._PURGE_QUEUE})  # purged by another request's fault
    with pytest.raises(KafkaUnavailableError, match=r"withdrawn.*retrying it is safe"):
        _producer(fake).produce_identified(_records(1), timeout_s=5)
