"""The operation journal: lifecycle events, bounded queue, counted drops, never blocking."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from purgatory import DelayedOperationPurgatory, MockTimer
from purgatory.journal import (
    AnsweredOperation,
    EventType,
    FileJournalSink,
    Journal,
    JournalEvent,
    JournalFormatError,
)
from purgatory.journal.synthetic import synthetic_events, write_jsonl

from .ops import MockDelayedOperation

WAIT_S = 10.0  # bound on every wait for the writer thread


class ListSink:
    """Collects batches; optionally blocks in ``write`` until released, or fails some writes."""

    def __init__(self, *, block: bool = False, fail_first: int = 0) -> None:
        self.events: list[JournalEvent] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not block:
            self.release.set()
        self.fail_first = fail_first
        self.flushes = 0
        self.closed = False

    def write(self, events: Sequence[JournalEvent]) -> None:
        self.entered.set()
        assert self.release.wait(WAIT_S), "test never released the sink"
        if self.fail_first > 0:
            self.fail_first -= 1
            raise OSError("disk full (simulated)")
        self.events.extend(events)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def _purgatory() -> DelayedOperationPurgatory[MockDelayedOperation]:
    return DelayedOperationPurgatory("Fetch", timer=MockTimer(), reaper_enabled=False)


def test_each_operation_journals_created_then_its_outcome_with_latency() -> None:
    sink = ListSink()
    journal = Journal([sink], flush_interval_s=0.01)
    purgatory = _purgatory()
    journal.attach(purgatory)
    try:
        completed = MockDelayedOperation(1000)
        expired = MockDelayedOperation(50)
        purgatory.try_complete_else_watch(completed, ["orders-0", "orders-1"])
        purgatory.try_complete_else_watch(expired, ["orders-2"])
        completed.completable = True
        assert purgatory.check_and_complete("orders-1") == 1
        purgatory._timer.advance_clock(100)
        assert expired.outcome is not None, "the 50 ms operation should have expired"
        assert journal.flush(WAIT_S), "writer did not flush in time"
    finally:
        purgatory.shutdown()
        journal.close()

    by_op: dict[str, list[JournalEvent]] = {}
    for event in sink.events:
        by_op.setdefault(event.op_id, []).append(event)
    assert len(by_op) == 2, f"two operations, got {by_op}"
    kinds = sorted(tuple(e.event_type.value for e in events) for events in by_op.values())
    assert kinds == [("created", "completed"), ("created", "expired")], kinds
    for created, finished in by_op.values():
        assert created.op_type == "MockDelayedOperation" and created.purgatory == "Fetch"
        assert finished.latency_ms is not None and finished.latency_ms >= 0.0
        assert created.event_id == f"{created.op_id}:created"
        assert finished.event_id == f"{finished.op_id}:{finished.event_type.value}"
        assert finished.ts_ms >= created.ts_ms
    created_keys = {e.keys for e in sink.events if e.event_type is EventType.CREATED}
    assert created_keys == {("orders-0", "orders-1"), ("orders-2",)}
    timeouts = {e.timeout_ms for e in sink.events if e.event_type is EventType.CREATED}
    assert timeouts == {1000, 50}
    assert len({e.event_id for e in sink.events}) == 4, "event ids must be unique"
    assert sink.closed, "close() closes the sinks"


async def test_a_cancelled_awaiting_task_journals_cancelled() -> None:
    sink = ListSink()
    journal = Journal([sink], flush_interval_s=0.01)
    purgatory = _purgatory()
    journal.attach(purgatory)
    try:
        op = MockDelayedOperation(10_000)
        task = asyncio.create_task(purgatory.watch(op, ["k"]))
        await asyncio.sleep(0)  # let the task submit the operation
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert journal.flush(WAIT_S)
    finally:
        purgatory.shutdown()
        journal.close()
    assert [e.event_type for e in sink.events] == [EventType.CREATED, EventType.CANCELLED]


def test_a_stuck_sink_never_blocks_callers_and_every_drop_is_counted() -> None:
    sink = ListSink(block=True)
    journal = Journal([sink], capacity=100, batch_size=10, flush_interval_s=0.01)
    op = MockDelayedOperation(10)
    try:
        journal.on_submitted("Fetch", op, ["k"])
        assert sink.entered.wait(WAIT_S), "writer never reached the sink"
        # The writer holds one event inside the stuck sink; the queue is empty and bounded at 100.
        for _ in range(1000):
            journal.on_submitted("Fetch", op, ["k"])
        stats = journal.stats()
        assert stats.dropped == 900, f"1000 offered to a queue of 100 must drop 900, got {stats}"
        assert stats.queued == 100
        sink.release.set()
        assert journal.flush(WAIT_S)
        stats = journal.stats()
        assert stats.written == 101 and stats.dropped == 900 and stats.accepted == 101, stats
    finally:
        sink.release.set()
        journal.close()


def test_events_offered_after_close_are_dropped_and_counted() -> None:
    sink = ListSink()
    journal = Journal([sink])
    journal.close()
    journal.on_finished("Fetch", MockDelayedOperation(10))
    assert journal.stats().dropped == 1
    assert sink.events == []


def test_a_failing_sink_loses_only_its_batch_and_the_writer_lives_on() -> None:
    failing = ListSink(fail_first=1)
    healthy = ListSink()
    journal = Journal([failing, healthy], batch_size=1000, flush_interval_s=0.01)
    op = MockDelayedOperation(10)
    try:
        journal.on_submitted("Fetch", op, ["k"])
        assert journal.flush(WAIT_S)
        journal.on_submitted("Fetch", op, ["k"])
        assert journal.flush(WAIT_S)
        stats = journal.stats()
    finally:
        journal.close()
    assert stats.failed == 1, f"the first batch failed on one sink: {stats}"
    assert len(failing.events) == 1 and len(healthy.events) == 2
    assert stats.written == 3  # event-sink pairs that succeeded


def test_concurrent_writers_lose_nothing_below_capacity() -> None:
    sink = ListSink()
    journal = Journal([sink], capacity=1_000_000, flush_interval_s=0.01)
    threads_n, per_thread = 4, 5000
    ops = [MockDelayedOperation(10) for _ in range(threads_n)]
    start = threading.Barrier(threads_n)

    def produce(op: MockDelayedOperation) -> None:
        start.wait(WAIT_S)
        for _ in range(per_thread):
            journal.on_submitted("Fetch", op, ["k"])

    workers = [threading.Thread(target=produce, args=(op,)) for op in ops]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
    try:
        assert journal.flush(WAIT_S)
        stats = journal.stats()
    finally:
        journal.close()
    assert stats.dropped == 0 and stats.written == threads_n * per_thread, stats
    assert len(sink.events) == threads_n * per_thread


def test_journal_refuses_bad_arguments_with_the_value() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Journal([])
    with pytest.raises(TypeError, match="does not implement JournalSink"):
        Journal([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        Journal([ListSink()], capacity=0)


# -- events -------------------------------------------------------------------------------------


def test_event_round_trips_through_json() -> None:
    events = list(synthetic_events(20, seed=3))
    for event in events:
        assert JournalEvent.from_json(event.to_json()) == event


def test_to_json_is_exactly_json_dumps_even_for_awkward_strings() -> None:
    awkward = [
        JournalEvent('é"\\x', EventType.CREATED, "o\n", "T\u2028", "P", 5, ('k"1', "ü", ""), None),
        JournalEvent("e", EventType.EXPIRED, "o", "T", "P", 5, latency_ms=1e-7),
        JournalEvent("e", EventType.CANCELLED, "o", "T", "P", -1, latency_ms=12.5),
    ]
    for event in [*awkward, *synthetic_events(50, seed=9)]:
        assert event.to_json() == json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False)
        assert JournalEvent.from_json(event.to_json()) == event


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"event_type": "exploded"}', "event_type = 'exploded': unknown"),
        ('{"event_type": "created", "event_id": "e", "op_id": "o", "op_type": "t"}', "purgatory = None"),
        (
            '{"event_type": "expired", "event_id": "e", "op_id": "o", "op_type": "t", "purgatory": "p",'
            ' "ts_ms": "soon"}',
            "ts_ms = 'soon'",
        ),
    ],
)
def test_a_bad_line_names_the_field_and_value(line: str, message: str) -> None:
    with pytest.raises(JournalFormatError, match=message):
        JournalEvent.from_json(line)


def test_synthetic_journal_is_deterministic_and_pairs_every_operation() -> None:
    first = list(synthetic_events(300, seed=7))
    assert first == list(synthetic_events(300, seed=7))
    assert len(first) == 600
    assert len({e.event_id for e in first}) == 600
    created = [e for e in first if e.event_type is EventType.CREATED]
    assert len(created) == 300
    assert {e.event_type for e in first} >= {EventType.COMPLETED, EventType.EXPIRED}


# -- file sink ----------------------------------------------------------------------------------


def _lines(directory: Path) -> list[str]:
    return [line for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


def test_file_sink_rotates_by_size_and_keeps_at_most_max_files(tmp_path: Path) -> None:
    events = list(synthetic_events(200, seed=1))  # 400 lines of ~190 bytes
    sink = FileJournalSink(tmp_path, max_bytes=4000, max_files=3)
    for start in range(0, len(events), 10):
        sink.write(events[start : start + 10])
    sink.close()
    segments = sink.segments()
    assert len(segments) == 3, f"max_files=3 must keep 3 segments, got {[p.name for p in segments]}"
    for closed in segments[:-1]:
        assert closed.stat().st_size >= 4000, "a segment rotates only once it reached max_bytes"
    kept = [JournalEvent.from_json(line) for line in _lines(tmp_path)]
    assert kept == events[-len(kept) :], "the newest events are kept, in order, oldest deleted"


def test_a_new_file_sink_never_appends_to_an_existing_segment(tmp_path: Path) -> None:
    first = FileJournalSink(tmp_path)
    first.write(list(synthetic_events(1, seed=1)))
    first.close()
    before = {path: path.read_bytes() for path in first.segments()}
    second = FileJournalSink(tmp_path)
    second.write(list(synthetic_events(1, seed=2)))
    second.close()
    for path, content in before.items():
        assert path.read_bytes() == content
    assert len(second.segments()) == 2
    assert len(_lines(tmp_path)) == 4


def test_journal_to_files_end_to_end(tmp_path: Path) -> None:
    journal = Journal([FileJournalSink(tmp_path, max_bytes=2000)], batch_size=10, flush_interval_s=0.01)
    purgatory = _purgatory()
    journal.attach(purgatory)
    ops = [MockDelayedOperation(20) for _ in range(30)]
    try:
        for index, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [f"k{index % 3}"])
        purgatory._timer.advance_clock(50)
    finally:
        purgatory.shutdown()
        journal.close()
    records = [json.loads(line) for line in _lines(tmp_path)]
    assert len(records) == 60
    assert sum(r["event_type"] == "expired" for r in records) == 30
    assert len(list(tmp_path.glob("*.jsonl"))) > 1, "2000-byte segments must have rotated"


def test_write_jsonl_counts_lines(tmp_path: Path) -> None:
    assert write_jsonl(tmp_path / "j.jsonl", synthetic_events(5)) == 10


class AnsweredOp(MockDelayedOperation):
    """An operation that tells the journal what its caller saw (AnsweredOperation)."""

    def __init__(self, delay_ms: int, code: str, requested_ns: int) -> None:
        super().__init__(delay_ms)
        self.code = code
        self.requested_ns = requested_ns

    def answer_code(self) -> str:
        if self.code == "raise":
            raise RuntimeError("answer_code failed (simulated)")
        return self.code


def test_finish_events_carry_the_answer_code_and_the_callers_latency_from_its_request() -> None:
    sink = ListSink()
    journal = Journal([sink], flush_interval_s=0.01)
    purgatory = _purgatory()
    journal.attach(purgatory)
    # Asked 250 ms before the purgatory was handed the op (a check, a send): the caller waited that too.
    asked = time.monotonic_ns() - 250_000_000
    failed = AnsweredOp(1000, "NOT_ENOUGH_REPLICAS", asked)
    plain = MockDelayedOperation(1000)
    try:
        assert isinstance(failed, AnsweredOperation)
        purgatory.try_complete_else_watch(failed, ["orders-0"])
        purgatory.try_complete_else_watch(plain, ["orders-1"])
        failed.completable = plain.completable = True
        purgatory.check_and_complete("orders-0")
        purgatory.check_and_complete("orders-1")
        assert journal.flush(WAIT_S)
    finally:
        purgatory.shutdown()
        journal.close()
    finishes = {e.op_id: e for e in sink.events if e.event_type is EventType.COMPLETED}
    assert len(finishes) == 2
    answered = [e for e in finishes.values() if e.error_code is not None]
    assert [e.error_code for e in answered] == ["NOT_ENOUGH_REPLICAS"]
    assert answered[0].latency_ms is not None and answered[0].latency_ms >= 250.0
    other = [e for e in finishes.values() if e.error_code is None]
    assert len(other) == 1 and other[0].latency_ms is not None and other[0].latency_ms < 250.0
    assert '"error_code":"NOT_ENOUGH_REPLICAS"' in answered[0].to_json()
    assert "error_code" not in other[0].to_json(), "absent, not null, when the op does not say"


def test_an_answer_code_that_raises_leaves_the_code_out_and_the_writer_running() -> None:
    sink = ListSink()
    journal = Journal([sink], flush_interval_s=0.01)
    purgatory = _purgatory()
    journal.attach(purgatory)
    try:
        broken = AnsweredOp(1000, "raise", time.monotonic_ns())
        purgatory.try_complete_else_watch(broken, ["k"])
        broken.completable = True
        purgatory.check_and_complete("k")
        after = MockDelayedOperation(1000)
        purgatory.try_complete_else_watch(after, ["j"])
        after.completable = True
        purgatory.check_and_complete("j")
        assert journal.flush(WAIT_S)
    finally:
        purgatory.shutdown()
        journal.close()
    finishes = [e for e in sink.events if e.event_type is EventType.COMPLETED]
    assert len(finishes) == 2 and all(e.error_code is None for e in finishes)


def test_an_operation_answered_without_submission_is_recorded_with_both_events() -> None:
    sink = ListSink()
    journal = Journal([sink], flush_interval_s=0.01)
    ops = []
    try:
        for _ in range(2):
            op = AnsweredOp(1000, "UNKNOWN_TOPIC_OR_PARTITION", time.monotonic_ns())
            assert op.force_complete(), "refused: finished at once, never handed to a purgatory"
            journal.record_unsubmitted("fetch", op, ["orders-7"])
            ops.append(op)
        with pytest.raises(ValueError, match="not finished"):
            journal.record_unsubmitted("fetch", AnsweredOp(1000, "NONE", 0), ["orders-7"])
        assert journal.flush(WAIT_S)
    finally:
        journal.close()
    assert [e.event_type for e in sink.events] == [EventType.CREATED, EventType.COMPLETED] * 2
    assert len({e.op_id for e in sink.events}) == 2, "two unsubmitted ops never share an id"
    assert {e.keys for e in sink.events if e.event_type is EventType.CREATED} == {("orders-7",)}
    assert all(
        e.error_code == "UNKNOWN_TOPIC_OR_PARTITION" and e.purgatory == "fetch"
        for e in sink.events
        if e.event_type is EventType.COMPLETED
    )


@pytest.mark.parametrize("bad", [5, ["NONE"], True])
def test_a_non_string_error_code_is_a_bad_line_naming_the_field(bad: object) -> None:
    line = json.dumps(
        {
            "event_id": "o:completed",
            "event_type": "completed",
            "op_id": "o",
            "op_type": "T",
            "purgatory": "P",
            "ts_ms": 1,
            "latency_ms": 1.0,
            "error_code": bad,
        }
    )
    with pytest.raises(JournalFormatError, match="error_code"):
        JournalEvent.from_json(line)


def test_error_code_survives_the_json_round_trip() -> None:
    event = JournalEvent("e", EventType.COMPLETED, "o", "T", "P", 5, latency_ms=3.5, error_code='A"B')
    assert event.to_json() == json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False)
    assert JournalEvent.from_json(event.to_json()) == event
