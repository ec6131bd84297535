"""The request/reply sender's in-flight window, without a cluster (adapters/kafka/clients/_sender.py).

librdkafka's idempotent producer spins its broker thread while 5 records of a partition are
unacknowledged and a batch is ready; the sender holds records back instead (module doc, "The
in-flight window"). A fake producer stands in for librdkafka here: it records what was handed
to it and the test plays the delivery reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError
from purgatory.adapters.kafka import KafkaAdapterError, KafkaUnavailableError
from purgatory.adapters.kafka.clients._sender import (
    IDEMPOTENCE_WINDOW,
    HeldRecord,
    InFlightWindow,
    RecordSender,
)
from purgatory.adapters.kafka.settings import KafkaSettings


@dataclass
class _Produced:
    topic: str
    value: bytes | None
    partition: int | None
    on_delivery: Callable[[Any, Any], None]


@dataclass
class _FakeProducer:
    """What RecordSender uses of confluent_kafka.Producer; reports are played by the test."""

    produced: list[_Produced] = field(default_factory=list)
    refuse: bool = False
    refuse_values: set[bytes] = field(default_factory=set)  # queue full for these records only

    def produce(
        self, topic: str, value: bytes | None, key: bytes | None = None, *args: Any, **kw: Any
    ) -> None:
        if self.refuse or value in self.refuse_values:
            raise BufferError
        for _, header in kw.get("headers") or ():
            if header is not None and not isinstance(header, str | bytes):  # as confluent_kafka
                raise TypeError(
                    f"expected header value to be None, binary, or unicode string, not {header!r}"
                )
        partition = args[0] if args else None
        self.produced.append(_Produced(topic, value, partition, kw["on_delivery"]))

    def acknowledge(self, n: int, error: object = None) -> None:
        """Report the oldest ``n`` unreported records delivered (or failed with ``error``)."""
        for record in [p for p in self.produced if p.on_delivery is not None][:n]:
            callback, record.on_delivery = record.on_delivery, None  # type: ignore[assignment]
            callback(error, object())

    def flush(self, timeout: float) -> int:
        return 0

    def __len__(self) -> int:
        return sum(1 for p in self.produced if p.on_delivery is not None)


def _sender(producer: _FakeProducer) -> RecordSender:
    sender = RecordSender(KafkaSettings(bootstrap_servers="127.0.0.1:9"), name="test")
    sender._producer = producer  # type: ignore[assignment]  # no client, no sender thread
    return sender


def _record(topic: str = "t", partition: int | None = 0, value: bytes = b"v") -> HeldRecord:
    return HeldRecord(topic, value, None, partition, [], lambda e, m: None, 0.0)


def test_a_partition_with_a_full_window_holds_the_next_record_until_a_report() -> None:
    window = InFlightWindow()
    assert all(window.admit(_record(value=b"%d" % i)) for i in range(IDEMPOTENCE_WINDOW))
    held = _record(value=b"held")
    assert not window.admit(held)
    assert window.held() == 1
    assert window.reported("t", 0) == [held]  # one report: below the window again, released
    assert window.held() == 0


def test_records_sent_while_some_are_held_wait_behind_them_and_leave_together_in_order() -> None:
    window = InFlightWindow(size=2)
    assert window.admit(_record(value=b"a")) and window.admit(_record(value=b"b"))
    later = [_record(value=v) for v in (b"c", b"d", b"e")]
    assert not any(window.admit(r) for r in later)
    assert [r.value for r in window.reported("t", 0)] == [b"c", b"d", b"e"]
    assert not window.admit(_record(value=b"f"))  # c, d, e and b are unreported: 4 >= 2


def test_windows_are_per_partition_and_a_partitioner_picked_lane_per_topic() -> None:
    window = InFlightWindow(size=1)
    assert window.admit(_record(partition=0))
    assert window.admit(_record(partition=1))
    assert window.admit(_record(partition=None))
    assert window.admit(_record(topic="other", partition=0))
    assert not window.admit(_record(partition=0))
    assert window.reported("t", 1) == []  # another partition's report releases nothing of 0


def test_the_sender_hands_librdkafka_no_record_of_a_partition_with_five_unreported() -> None:
    producer = _FakeProducer()
    sender = _sender(producer)
    outcomes: list[tuple[bytes, object]] = []
    for i in range(12):
        value = b"%d" % i
        sender.send("t", value, partition=0, on_delivery=lambda e, m, v=value: outcomes.append((v, e)))
    assert [p.value for p in producer.produced] == [b"0", b"1", b"2", b"3", b"4"]
    assert sender.stats.held == 7 and sender.in_flight() == 12
    producer.acknowledge(1)  # one report: the seven held records go together, in order
    assert [p.value for p in producer.produced][5:] == [b"%d" % i for i in range(5, 12)]
    producer.acknowledge(11)
    assert sorted(v for v, _ in outcomes) == sorted(b"%d" % i for i in range(12))
    assert all(e is None for _, e in outcomes) and sender.in_flight() == 0


def test_a_held_record_past_the_message_timeout_is_reported_unavailable_not_produced() -> None:
    producer = _FakeProducer()
    sender = _sender(producer)
    sender._message_timeout_s = 0.0  # every held record is overdue at its release
    errors: list[KafkaAdapterError | None] = []
    for _ in range(IDEMPOTENCE_WINDOW + 1):
        sender.send("t", b"v", partition=0, on_delivery=lambda e, m: errors.append(e))
    producer.acknowledge(1)
    assert len(producer.produced) == IDEMPOTENCE_WINDOW  # the held one never reached librdkafka
    assert errors.count(None) == 1  # the acknowledged one
    assert [type(e) for e in errors if e is not None] == [KafkaUnavailableError]
    assert sender.stats.failed == 1 and sender.in_flight() == IDEMPOTENCE_WINDOW - 1


def test_a_held_record_librdkafka_refuses_at_release_is_reported_and_frees_its_place() -> None:
    producer = _FakeProducer()
    sender = _sender(producer)
    errors: list[KafkaAdapterError | None] = []
    for _ in range(IDEMPOTENCE_WINDOW + 1):
        sender.send("t", b"v", partition=0, on_delivery=lambda e, m: errors.append(e))
    producer.refuse = True
    producer.acknowledge(1)
    # Queue full: reported typed (nothing lost silently), besides the acknowledged one.
    assert errors.count(None) == 1
    assert [type(e) for e in errors if e is not None] == [KafkaUnavailableError]
    producer.refuse = False
    sender.send("t", b"after", partition=0)  # 4 unreported: room again
    assert producer.produced[-1].value == b"after"


def test_a_window_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="window size"):
        InFlightWindow(size=0)


def _send_all(
    sender: RecordSender, values: list[bytes], reports: list[tuple[bytes, object]], **kw: Any
) -> None:
    for value in values:
        sender.send("t", value, partition=0, on_delivery=lambda e, m, v=value: reports.append((v, e)), **kw)


def test_held_records_behind_refused_ones_are_produced_in_order_and_every_record_reported_once() -> None:
    """A release that fails some held records: the ones behind them still go, in order; the
    failures give their place back; every record is reported exactly once; the lane ends empty."""
    producer = _FakeProducer(refuse_values={b"h0", b"h2"})
    sender = _sender(producer)
    reports: list[tuple[bytes, object]] = []
    first = [b"%d" % i for i in range(IDEMPOTENCE_WINDOW)]
    held = [b"h0", b"h1", b"h2", b"h3"]
    _send_all(sender, first + held, reports)
    producer.acknowledge(1)  # releases the four held: h0 and h2 refused, h1 and h3 produced
    assert [p.value for p in producer.produced] == [*first, b"h1", b"h3"], "in order, the refused left out"
    # The window moves before the delivered record's own report (so its callback finds room).
    assert [(v, type(e)) for v, e in reports] == [
        (b"h0", KafkaUnavailableError),
        (b"h2", KafkaUnavailableError),
        (b"0", type(None)),
    ]
    assert sender.in_flight() == IDEMPOTENCE_WINDOW - 1 + 2, "the refused two no longer counted"
    producer.acknowledge(len(producer))
    assert sorted(v for v, _ in reports) == sorted(first + held), "each record reported once"
    assert len(reports) == len(first + held)
    assert sender.in_flight() == 0 and sender._window._lanes == {}, "no count left behind in the lane"
    sender.send("t", b"after", partition=0)
    assert producer.produced[-1].value == b"after", "the lane's window is whole again"


def test_a_failed_delivery_releases_the_held_records_as_a_success_does() -> None:
    producer = _FakeProducer()
    sender = _sender(producer)
    reports: list[tuple[bytes, object]] = []
    _send_all(sender, [b"%d" % i for i in range(IDEMPOTENCE_WINDOW + 2)], reports)
    producer.acknowledge(1, error=KafkaError(KafkaError._MSG_TIMED_OUT))
    assert [p.value for p in producer.produced][IDEMPOTENCE_WINDOW:] == [b"5", b"6"]
    assert [v for v, e in reports if e is not None] == [b"0"]
    producer.acknowledge(len(producer))
    assert len(reports) == IDEMPOTENCE_WINDOW + 2 and sender.in_flight() == 0


def test_a_held_record_the_client_refuses_as_malformed_is_reported_typed_and_the_lane_moves_on() -> None:
    """A header value confluent_kafka refuses (TypeError) is only seen when a held record is
    released: it must be reported as a typed refusal, not escape the release and leave the records
    behind it counted but never produced (the partition's window wedged for good)."""
    producer = _FakeProducer()
    sender = _sender(producer)
    reports: list[tuple[bytes, object]] = []
    _send_all(sender, [b"%d" % i for i in range(IDEMPOTENCE_WINDOW)], reports)
    sender.send(
        "t", b"bad", partition=0, headers=[("h", 5)], on_delivery=lambda e, m: reports.append((b"bad", e))
    )  # type: ignore[list-item]
    _send_all(sender, [b"behind"], reports)
    producer.acknowledge(1)
    assert [p.value for p in producer.produced][IDEMPOTENCE_WINDOW:] == [b"behind"]
    refused = dict(reports)[b"bad"]
    assert isinstance(refused, KafkaAdapterError) and "header" in str(refused), refused
    producer.acknowledge(len(producer))
    assert len(reports) == IDEMPOTENCE_WINDOW + 2 and sender.in_flight() == 0


def test_the_client_refusing_an_admitted_record_raises_typed_at_send() -> None:
    producer = _FakeProducer()
    sender = _sender(producer)
    with pytest.raises(KafkaAdapterError, match="header"):
        sender.send("t", b"bad", partition=0, headers=[("h", 5)])  # type: ignore[list-item]
    assert sender.in_flight() == 0, "nothing queued, nothing counted"


def test_a_raising_delivery_callback_does_not_keep_the_other_records_from_being_reported() -> None:
    producer = _FakeProducer()
    sender = _sender(producer)
    sender._message_timeout_s = 0.0  # every held record is overdue at its release: reported failed
    reports: list[tuple[bytes, object]] = []

    def raising(error: object, message: object) -> None:
        reports.append((b"raising", error))
        raise RuntimeError("a caller's callback failed")

    _send_all(sender, [b"%d" % i for i in range(IDEMPOTENCE_WINDOW)], reports)
    sender.send("t", b"raising", partition=0, on_delivery=raising)
    _send_all(sender, [b"behind"], reports)
    producer.acknowledge(1)
    assert [v for v, _ in reports] == [b"raising", b"behind", b"0"], (
        "all three reported, the failures in order"
    )
    assert sender.in_flight() == IDEMPOTENCE_WINDOW - 1
