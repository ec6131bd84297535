"""Equal long polls share one operation, each waiter with its own deadline (app/_poll_groups.py).

No Kafka: the offset index tests' fake view, a record cache fed as the tail feeds it (reads never
reach a broker), a fetch purgatory on a MockTimer, the feed driven by ``poll_once``, the service's
own operation (``OffLoopFetch``) completed on the feed's thread as in the service, and a fake loop
whose clock the test moves (the waiters' own deadlines).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from purgatory.adapters.kafka import DelayedFetch, FetchedRecord
from purgatory.adapters.kafka.facts._record_cache import SharedReadReader
from purgatory.adapters.kafka.ops._off_loop_fetch import OffLoopFetch
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service.answers._shared import SharedAnswers
from purgatory.adapters.service.app._poll_groups import ANSWER_SLICE, PollGroups, equal_polls

from purgatory import Outcome, PurgatoryFullError
from purgatory._operation_core import extras_of
from purgatory.journal import Journal, MemoryJournalSink
from tests.kafka.test_offset_index import KEY, _facts, feed_on_mock_timer

AT = 5
WAIT_MS = 1_000
GROUP_WAIT_MS = 2 * WAIT_MS


class _Handle:
    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when, self.fn, self.cancelled = when, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """The two calls PollGroups makes of its loop; time moves only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[_Handle] = []
        self.ready: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.ready.append((fn, args))

    def run_ready(self) -> int:
        """One loop iteration's callbacks; how many ran."""
        ready, self.ready = self.ready, []
        for fn, args in ready:
            fn(*args)
        return len(ready)

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, fn: Callable[[], None]) -> _Handle:
        handle = _Handle(when, fn)
        self.handles.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [h for h in self.handles if not h.cancelled and h.when <= self.now]
        due.sort(key=lambda h: h.when)
        self.handles = [h for h in self.handles if h not in due]
        for handle in due:
            if not handle.cancelled:
                handle.fn()


@dataclass
class Answers:
    """Every callback call, per waiter name: the exactly-once ledger."""

    calls: dict[str, list[DelayedFetch]] = field(default_factory=dict)

    def callback(self, name: str) -> Callable[[DelayedFetch], None]:
        self.calls.setdefault(name, [])
        return self.calls[name].append


@dataclass
class Rig:
    view: Any
    feed: Any
    purgatory: Any
    timer: Any
    reader: SharedReadReader
    attempts: ThreadPoolExecutor
    loop: FakeLoop
    groups: PollGroups
    answers: Answers

    def join(
        self,
        name: str,
        *,
        offset: int = AT,
        wait_ms: int = WAIT_MS,
        max_per_key: int | None = None,
        **params: Any,
    ) -> Any:
        min_records = params.get("min_records", 1)
        min_bytes = params.get("min_bytes")
        max_bytes = params.get("max_bytes", 1 << 20)

        def make_op(op_wait_ms: int) -> DelayedFetch:
            return OffLoopFetch(
                self.feed,
                self.reader,
                {KEY: offset},
                min_records=min_records,
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                max_wait_ms=op_wait_ms,
                loop_thread=-1,
                attempts=self.attempts,
            )

        equal = equal_polls(KEY, offset, min_records, min_bytes, max_bytes)
        waiter = self.groups.join(
            equal, KEY, wait_ms, GROUP_WAIT_MS, make_op, self.answers.callback(name), max_per_key
        )
        self.feed.poll_once()  # the feed follows the key now: its facts known, as the service's are
        return waiter

    def append(self, *values: bytes) -> None:
        high = self.view.partitions[KEY].high_watermark
        records = [FetchedRecord(high + i, b"k", value, 0) for i, value in enumerate(values)]
        self.reader.append(KEY, records)  # the tail: records before facts
        self.view.partitions[KEY] = _facts(high + len(values))
        self.feed.poll_once()


@pytest.fixture
def rig() -> Iterator[Rig]:
    with feed_on_mock_timer("fetch", "groups") as (view, feed, purgatory, timer):
        reader = SharedReadReader(KafkaSettings(), bootstrap_servers="127.0.0.1:1")  # memory only
        attempts = ThreadPoolExecutor(1)
        view.partitions[KEY] = _facts(AT)
        feed.poll_once()

        def submit(op: DelayedFetch, callback: Callable[[DelayedFetch], None]) -> None:
            # As watch_then_call without a loop: the finish calls the waiter on its own thread.
            extras_of(op).waiter = callback  # type: ignore[assignment]
            purgatory.try_complete_else_watch(op, op.watch_keys())

        loop = FakeLoop()
        groups = PollGroups(submit, purgatory.abandon, "fetch", loop=loop)  # type: ignore[arg-type]
        yield Rig(view, feed, purgatory, timer, reader, attempts, loop, groups, Answers())
        attempts.shutdown()


def test_equal_long_polls_share_one_operation(rig: Rig) -> None:
    waiters = [rig.join(f"w{i}") for i in range(50)]
    assert rig.purgatory.num_delayed() == 1, "one operation for the group"
    assert len({id(w.op) for w in waiters}) == 1
    assert rig.groups.waiters == 50 and rig.groups.per_key[KEY] == 50
    rig.append(b"one")
    ops = {id(calls[0]) for calls in rig.answers.calls.values()}
    assert len(ops) == 1, "every waiter got the group's operation"
    op = rig.answers.calls["w0"][0]
    assert op.outcome is Outcome.COMPLETED and [r.value for r in op.parts[0].records] == [b"one"]
    assert all(len(calls) == 1 for calls in rig.answers.calls.values()), "each answered once"
    assert rig.groups.waiters == 0 and KEY not in rig.groups.per_key and not rig.groups.groups


def test_unequal_long_polls_have_their_own_operations(rig: Rig) -> None:
    rig.join("base")
    rig.join("offset", offset=AT - 1)  # records there already: completes alone
    rig.join("records", min_records=2)
    rig.join("bytes", max_bytes=150)
    rig.join("min_bytes", min_bytes=1)
    rig.join("wait", wait_ms=WAIT_MS // 2)  # another wait: the same question, the same group
    assert rig.groups.groups_made == 5 and rig.groups.joined == 1
    rig.append(b"a" * 100, b"b" * 100)
    assert [r.offset for r in rig.answers.calls["bytes"][0].parts[0].records] == [AT]
    assert [r.offset for r in rig.answers.calls["records"][0].parts[0].records] == [AT, AT + 1]
    assert rig.answers.calls["base"][0] is rig.answers.calls["wait"][0]
    assert rig.answers.calls["base"][0] is not rig.answers.calls["records"][0]


def test_a_waiter_whose_deadline_comes_first_gets_the_empty_expired_answer_alone(rig: Rig) -> None:
    rig.join("short", wait_ms=100)
    long = rig.join("long", wait_ms=WAIT_MS)
    rig.loop.advance(0.1)
    (expired,) = rig.answers.calls["short"]
    assert expired.outcome is Outcome.EXPIRED and expired.parts[0].records == ()
    assert expired is not long.op, "the group's operation waits on"
    assert rig.groups.expired_alone == 0, "the facts vouch nothing arrived: no read, no operation"
    assert expired.parts[0].fetch_offset == AT and expired.error is None
    assert rig.answers.calls["long"] == [] and long.op.outcome is None
    assert rig.groups.waiters == 1 and rig.purgatory.num_delayed() == 1
    rig.append(b"one")
    (completed,) = rig.answers.calls["long"]
    assert completed.outcome is Outcome.COMPLETED and len(rig.answers.calls["short"]) == 1


def test_a_waiter_expiring_below_a_threshold_reads_what_arrived_as_a_lone_poll_does(rig: Rig) -> None:
    rig.join("few", wait_ms=100, min_records=3)
    rig.join("patient", wait_ms=WAIT_MS, min_records=3)
    rig.append(b"one")  # below min_records: the group waits on
    assert rig.answers.calls["few"] == []
    rig.loop.advance(0.1)  # its deadline: a lone operation with no wait reads what is there
    assert rig.groups.expired_alone == 1
    rig.timer.advance_clock(0)
    (answer,) = rig.answers.calls["few"]
    assert answer.outcome is Outcome.EXPIRED and [r.value for r in answer.parts[0].records] == [b"one"]
    assert rig.answers.calls["patient"] == [] and rig.groups.waiters == 1


def test_a_waiter_that_leaves_is_out_of_its_group_and_the_last_one_cancels_it(rig: Rig) -> None:
    first, second, third = (rig.join(name) for name in ("first", "second", "third"))
    op = first.op
    rig.groups.leave(first)
    assert op.outcome is None and rig.groups.waiters == 2
    rig.groups.leave(second)
    rig.groups.leave(second)  # twice: no effect
    assert op.outcome is None and rig.groups.waiters == 1
    rig.groups.leave(third)
    assert op.outcome is Outcome.CANCELLED and rig.purgatory.num_delayed() == 0
    assert rig.groups.waiters == 0 and not rig.groups.groups
    rig.append(b"one")
    rig.loop.advance(10)
    assert all(calls == [] for calls in rig.answers.calls.values()), "a waiter that left is never answered"


def test_a_waiter_that_left_is_not_answered_when_its_group_completes(rig: Rig) -> None:
    gone = rig.join("gone")
    rig.join("stays")
    rig.groups.leave(gone)
    rig.append(b"one")
    assert rig.answers.calls["gone"] == [] and len(rig.answers.calls["stays"]) == 1
    rig.groups.leave(gone)  # after the answer: nothing happens
    rig.loop.advance(10)
    assert len(rig.answers.calls["stays"]) == 1, "no expiry after the answer"


def test_a_finished_group_is_never_joined(rig: Rig) -> None:
    first = rig.join("first")
    op = first.op
    # Finished on another thread, its callback not yet on the loop: as the handoff leaves it.
    extras_of(op).waiter = None
    rig.append(b"one")
    assert op.outcome is Outcome.COMPLETED and rig.answers.calls["first"] == []
    late = rig.join("late", offset=AT)
    assert late.op is not op, "a new group, deciding on today's facts"
    assert rig.answers.calls["late"][0].outcome is Outcome.COMPLETED  # records there: at once


def test_admission_counts_waiters_and_the_per_key_limit_refuses_past_it(rig: Rig) -> None:
    rig.join("a", max_per_key=2)
    rig.join("b", max_per_key=2)
    with pytest.raises(PurgatoryFullError, match="max_pending_per_key=2"):
        rig.join("c", max_per_key=2)
    assert rig.groups.waiters == 2 and rig.purgatory.num_delayed() == 1
    assert "c" in rig.answers.calls and rig.answers.calls["c"] == []


def test_a_long_poll_that_does_not_wait_is_its_own_operation(rig: Rig) -> None:
    waiter = rig.join("now", wait_ms=0)
    assert waiter.group is None and not rig.groups.groups
    rig.timer.advance_clock(0)
    (answer,) = rig.answers.calls["now"]
    assert answer.outcome is Outcome.EXPIRED and rig.groups.waiters == 0


def test_a_group_takes_no_waiter_its_operation_would_not_outlive(rig: Rig) -> None:
    first = rig.join("first")
    rig.loop.advance((GROUP_WAIT_MS - WAIT_MS) / 1000 + 0.001)  # first's deadline passed
    late = rig.join("late")
    assert late.op is not first.op and rig.groups.groups_made == 2


def test_one_answer_is_rendered_per_group_operation(rig: Rig) -> None:
    for i in range(20):
        rig.join(f"w{i}")
    rig.append(b"one")
    shared = SharedAnswers()
    bodies = {id(shared.body(KEY.topic, KEY.partition, calls[0])) for calls in rig.answers.calls.values()}
    assert len(bodies) == 1 and shared.rendered == 1 and shared.hits == 19
    encoded = []
    answer = shared.of(KEY.topic, KEY.partition, rig.answers.calls["w0"][0])
    headers = [(b"date", b"today")]
    for _ in range(3):
        encoded.append(answer.http11(headers, lambda body, h: b"HTTP/1.1 200 OK\r\n\r\n" + body))
    assert encoded[0] is encoded[1] is encoded[2], "encoded once per default headers"
    assert answer.http11([(b"date", b"tomorrow")], lambda body, h: b"x" + body) is not encoded[0]


def test_the_journal_records_one_answered_fetch_per_waiter(rig: Rig) -> None:
    sink = MemoryJournalSink()
    journal = Journal([sink], flush_interval_s=0.01).attach(rig.purgatory)
    try:
        rig.groups.journal = journal
        for name in ("first", "second", "third"):
            rig.join(name)
        rig.append(b"one")
        assert journal.flush(), "the journal's writer took every event"
    finally:
        journal.close()
    finished = [e for e in sink.events if e.event_type.value == "completed"]
    assert len(finished) == 3, [e.event_type for e in sink.events]
    assert {e.op_type for e in finished} == {"DelayedFetch"}
    assert all(e.latency_ms is not None and e.latency_ms >= 0 for e in finished)


def test_a_large_group_is_answered_a_slice_per_loop_iteration_and_a_leaver_is_skipped(rig: Rig) -> None:
    waiters = [rig.join(f"w{i}") for i in range(ANSWER_SLICE * 2 + 10)]
    rig.append(b"one")
    answered = sum(1 for calls in rig.answers.calls.values() if calls)
    assert answered == ANSWER_SLICE, "one slice at once: the loop reads other requests in between"
    rig.groups.leave(waiters[-1])  # leaves before its slice
    iterations = 0
    while rig.loop.run_ready():
        iterations += 1
    assert iterations == 2
    assert all(len(rig.answers.calls[f"w{i}"]) == 1 for i in range(len(waiters) - 1))
    assert rig.answers.calls[f"w{len(waiters) - 1}"] == [] and rig.groups.waiters == 0


def test_the_last_waiters_deadline_expires_the_groups_operation_as_a_lone_polls_does(rig: Rig) -> None:
    rig.join("short", wait_ms=100)
    last = rig.join("last", wait_ms=WAIT_MS)
    op = last.op
    expired_before = rig.purgatory.stats.as_dict()["expired"]
    rig.loop.advance(WAIT_MS / 1000)
    (answer,) = rig.answers.calls["last"]
    assert answer is op and op.outcome is Outcome.EXPIRED, "the group's own operation, expired"
    assert rig.purgatory.stats.as_dict()["expired"] == expired_before + 1, "counted as an expiry"
    assert rig.answers.calls["short"][0] is not op and rig.groups.waiters == 0 and not rig.groups.groups
