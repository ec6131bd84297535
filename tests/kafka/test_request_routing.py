"""Request-reply without a cluster: DelayedRequest's outcomes and the reply router's routing.

The purgatory runs on a MockTimer (only the test moves time); replies are handed to the router
the way its tail thread hands fetched records over (``_on_records``), and the partitions it reads
are set the way the tail and the ownership group report them. No Kafka client connects: the
router's sender and tail create their clients on first use, which these tests never reach.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any, cast

import pytest
from purgatory.adapters.kafka import (
    CORRELATION_ID,
    ERROR,
    REPLY_FROM,
    DelayedRequest,
    FetchedRecord,
    Moved,
    Reply,
    ReplyRouter,
    RequestTimeoutError,
    ResponderError,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import DelayedOperationPurgatory, Outcome
from purgatory.journal import Journal, MemoryJournalSink
from purgatory.testing import MockTimer

REPLIES = "replies"


def _reply(responder: str | None, value: bytes = b"v", *, offset: int = 0, error: str | None = None) -> Reply:
    return Reply(value, None, (), responder, error, 0, offset)


@pytest.fixture
def timer() -> MockTimer:
    return MockTimer()


@pytest.fixture
def purgatory(timer: MockTimer) -> Iterator[DelayedOperationPurgatory[Any]]:
    p = DelayedOperationPurgatory[Any]("request", timer=timer, reaper_enabled=False)
    yield p
    p.shutdown()


def _submitted(purgatory: DelayedOperationPurgatory[Any], **options: Any) -> DelayedRequest:
    op = DelayedRequest("c1", "prices", timeout_ms=options.pop("timeout_ms", 100), **options)
    purgatory.try_complete_else_watch(op, op.watch_keys())
    return op


def _deliver(purgatory: DelayedOperationPurgatory[Any], op: DelayedRequest, reply: Reply) -> int:
    op.offer(reply)
    return purgatory.check_and_complete(op.key)


# -- DelayedRequest ------------------------------------------------------------------------------


def test_the_first_reply_completes_the_request_and_copies_are_ignored(
    purgatory: DelayedOperationPurgatory[Any],
) -> None:
    op = _submitted(purgatory)
    assert _deliver(purgatory, op, _reply("pricer", b"42")) == 1
    assert _deliver(purgatory, op, _reply("pricer", b"42")) == 0, "a copy finishes nothing"
    assert op.outcome is Outcome.COMPLETED and op.duplicates == 1
    result = op.result()
    assert result.complete and result.value == b"42" and len(result.replies) == 1


def test_n_of_m_counts_distinct_responders_not_copies(purgatory: DelayedOperationPurgatory[Any]) -> None:
    op = _submitted(purgatory, wanted=2)
    _deliver(purgatory, op, _reply("a"))
    _deliver(purgatory, op, _reply("a"))
    assert not op.is_completed(), "two copies of a's reply are one reply"
    _deliver(purgatory, op, _reply("b"))
    assert op.is_completed() and [r.responder for r in op.result().replies] == ["a", "b"]


def test_anonymous_replies_are_distinct_by_record(purgatory: DelayedOperationPurgatory[Any]) -> None:
    op = _submitted(purgatory, wanted=2)
    _deliver(purgatory, op, _reply(None, offset=1))
    _deliver(purgatory, op, _reply(None, offset=2))
    assert op.is_completed(), "replies without purgatory_replyFrom (e.g. Spring's) count per record"


def test_deadline_raises_a_timeout_carrying_what_arrived(
    purgatory: DelayedOperationPurgatory[Any], timer: MockTimer
) -> None:
    op = _submitted(purgatory, wanted=3)
    _deliver(purgatory, op, _reply("a"))
    timer.advance_clock(100)
    assert op.outcome is Outcome.EXPIRED and op.done.is_set()
    with pytest.raises(RequestTimeoutError, match="1 of 3 replies within 100 ms") as timed_out:
        op.result()
    assert [r.responder for r in timed_out.value.replies] == ["a"]
    assert not op.offer(_reply("b")), "a reply after the deadline is not kept"


def test_deadline_with_partial_answers_with_what_arrived(
    purgatory: DelayedOperationPurgatory[Any], timer: MockTimer
) -> None:
    op = _submitted(purgatory, wanted=3, partial=True)
    _deliver(purgatory, op, _reply("a"))
    _deliver(purgatory, op, _reply("b"))
    timer.advance_clock(100)
    result = op.result()
    assert not result.complete and [r.responder for r in result.replies] == ["a", "b"]


def test_an_error_reply_raises_responder_error(purgatory: DelayedOperationPurgatory[Any]) -> None:
    op = _submitted(purgatory)
    _deliver(purgatory, op, _reply("pricer", error="ValueError: no such symbol"))
    with pytest.raises(ResponderError, match=r"pricer .* ValueError: no such symbol"):
        op.result()


def test_fail_finishes_once_and_loses_to_an_earlier_reply(purgatory: DelayedOperationPurgatory[Any]) -> None:
    from purgatory.adapters.kafka import KafkaUnavailableError

    failed = _submitted(purgatory)
    assert failed.fail(KafkaUnavailableError("not delivered"))
    with pytest.raises(KafkaUnavailableError, match="not delivered"):
        failed.result()
    answered = DelayedRequest("c2", "prices", timeout_ms=100)
    purgatory.try_complete_else_watch(answered, answered.watch_keys())
    _deliver(purgatory, answered, _reply("a"))
    assert not answered.fail(KafkaUnavailableError("too late")), "the reply finished it first"
    assert answered.result().value == b"v" and answered.error is None


@pytest.mark.parametrize(
    ("options", "field"),
    [({"wanted": 0}, "replies"), ({"wanted": True}, "replies"), ({"timeout_ms": 0}, "timeout_ms")],
)
def test_bad_arguments_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DelayedRequest("c", "t", **{"timeout_ms": 100, **options})


# -- ReplyRouter ---------------------------------------------------------------------------------


def test_each_way_a_request_finishes_is_journaled_and_counted_with_its_answer_code(
    purgatory: DelayedOperationPurgatory[Any], timer: MockTimer
) -> None:
    from purgatory.adapters.kafka import KafkaUnavailableError
    from purgatory.adapters.kafka._metrics import ANSWERS

    sink = MemoryJournalSink()
    journal = Journal([sink]).attach(purgatory)
    before = ANSWERS.snapshot()
    answered = _submitted(purgatory)
    _deliver(purgatory, answered, _reply("pricer"))
    refused = DelayedRequest("c2", "prices", timeout_ms=100)
    purgatory.try_complete_else_watch(refused, refused.watch_keys())
    _deliver(purgatory, refused, _reply("pricer", error="ValueError: no such symbol"))
    failed = DelayedRequest("c3", "prices", timeout_ms=100)
    purgatory.try_complete_else_watch(failed, failed.watch_keys())
    failed.fail(KafkaUnavailableError("not delivered"))
    timed_out = DelayedRequest("c4", "prices", timeout_ms=100)
    partial = DelayedRequest("c5", "prices", timeout_ms=100, wanted=2, partial=True)
    for op in (timed_out, partial):
        purgatory.try_complete_else_watch(op, op.watch_keys())
    timer.advance_clock(100)
    journal.close()
    codes = {op.correlation_id: op.answer_code() for op in (answered, refused, failed, timed_out, partial)}
    assert codes == {
        "c1": "NONE",
        "c2": "RESPONDER_ERROR",
        "c3": "KAFKA_UNAVAILABLE",
        "c4": "REQUEST_TIMED_OUT",
        "c5": "NONE",
    }
    finishes = [e for e in sink.events if e.op_type == "DelayedRequest" and e.event_type.value != "created"]
    assert sorted(e.error_code or "" for e in finishes) == sorted(codes.values())
    after = ANSWERS.snapshot()
    counted = {
        s: after.get(("DelayedRequest", s), 0) - before.get(("DelayedRequest", s), 0)
        for s in set(codes.values())
    }
    assert counted == {"NONE": 2, "RESPONDER_ERROR": 1, "KAFKA_UNAVAILABLE": 1, "REQUEST_TIMED_OUT": 1}


def _router(purgatory: DelayedOperationPurgatory[Any], ready: set[int]) -> ReplyRouter:
    router = ReplyRouter(
        KafkaSettings(bootstrap_servers="127.0.0.1:9"), purgatory, cast(Any, None), topic=REPLIES, group="g"
    )
    # What the ownership group and the tail report: partitions owned, then read from a position.
    router.on_assigned(frozenset(TopicPartitionKey(REPLIES, p) for p in ready), 1)
    router.tail.stats.following = frozenset(TopicPartitionKey(REPLIES, p) for p in ready)
    router._on_high_watermarks({})
    return router


def _record(
    correlation_id: str | None, responder: str = "r", offset: int = 0, error: str | None = None
) -> FetchedRecord:
    headers: list[tuple[str, bytes | None]] = [(REPLY_FROM, responder.encode())]
    if correlation_id is not None:
        headers.append((CORRELATION_ID, correlation_id.encode()))
    if error is not None:
        headers.append((ERROR, error.encode()))
    return FetchedRecord(offset, None, b"answer", 0, tuple(headers))


def _request(router: ReplyRouter, **options: Any) -> DelayedRequest:
    op = router.prepare("prices", timeout_ms=options.pop("timeout_ms", 100), **options)
    router.purgatory.try_complete_else_watch(op, op.watch_keys())
    return op


def test_router_completes_the_request_named_by_the_correlation_header(
    purgatory: DelayedOperationPurgatory[Any],
) -> None:
    router = _router(purgatory, {0, 1})
    ops = [_request(router) for _ in range(2)]
    assert [op.reply_partition for op in ops] == [0, 0], "requests name the home partition"
    key = TopicPartitionKey(REPLIES, 0)
    router._on_records(key, [_record(ops[1].correlation_id), _record(ops[1].correlation_id)])
    assert ops[1].is_completed() and not ops[0].is_completed()
    assert (router.stats.answered, router.stats.duplicates, router.pending()) == (1, 1, 1)


def test_an_awaited_request_answered_through_the_router_leaves_no_reference_cycle(
    purgatory: DelayedOperationPurgatory[Any],
) -> None:
    # Every request at 1,000/s that ends in a cycle (the op's lock face, or its asyncio waiter,
    # pointing back at it) is garbage only the cyclic GC frees: its collections then stalled
    # the requester for tens to hundreds of ms (purgatory bench request-reply's p99).
    router = _router(purgatory, {0})
    key = TopicPartitionKey(REPLIES, 0)

    async def one() -> None:
        op = router.prepare("prices", timeout_ms=1_000)
        asyncio.get_running_loop().call_soon(router._on_records, key, [_record(op.correlation_id)])
        await purgatory.watch(op, op.watch_keys())
        assert op.result().value == b"answer"

    async def flow() -> int:
        for _ in range(3):  # first-use allocations (the loop's handoff) are not the requests'
            await one()
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                await one()
            return gc.collect()
        finally:
            gc.enable()

    assert asyncio.run(flow()) == 0, "finished requests are freed by reference counting alone"
    assert router.stats.answered == 23


def test_router_tells_late_duplicate_unknown_and_malformed_replies_apart(
    purgatory: DelayedOperationPurgatory[Any], timer: MockTimer
) -> None:
    sink = MemoryJournalSink()
    journal = Journal([sink]).attach(purgatory)
    router = _router(purgatory, {0})
    answered, expired = _request(router), _request(router, timeout_ms=50)
    key = TopicPartitionKey(REPLIES, 0)
    router._on_records(key, [_record(answered.correlation_id)])
    timer.advance_clock(50)
    assert expired.outcome is Outcome.EXPIRED
    router._on_records(
        key,
        [
            _record(answered.correlation_id),
            _record(expired.correlation_id),
            _record("someone-else"),
            _record(None),
        ],
    )
    stats = router.stats
    assert (stats.duplicates, stats.late, stats.unknown, stats.malformed) == (1, 1, 1, 1)
    assert (stats.answered, stats.expired) == (1, 1)
    journal.close()
    late = [e for e in sink.events if e.op_type == "LateReply"]
    assert [e.event_type.value for e in late] == ["created", "completed"]
    assert late[0].keys == (f"correlation:{expired.correlation_id}",), "journaled on the request's key"


def test_a_revoked_reply_partition_is_read_until_its_requests_finish(
    purgatory: DelayedOperationPurgatory[Any],
) -> None:
    router = _router(purgatory, {0, 1})
    on_0 = _request(router)
    assert on_0.reply_partition == 0, "the home partition: the lowest one ready"
    router.on_revoked(frozenset({TopicPartitionKey(REPLIES, 0)}), Moved("revoked", None, 2))
    assert router.ready() == (1,), "new requests no longer name the revoked partition"
    assert all(_request(router).reply_partition == 1 for _ in range(3)), "the next owned one is home"
    assert TopicPartitionKey(REPLIES, 0) in router.tail._wanted, "still read: a request waits on it"
    router._on_records(TopicPartitionKey(REPLIES, 0), [_record(on_0.correlation_id)])
    assert on_0.result().complete
    assert TopicPartitionKey(REPLIES, 0) not in router.tail._wanted, "its last waiter done: dropped"


def test_no_ready_partition_is_a_typed_error(purgatory: DelayedOperationPurgatory[Any]) -> None:
    from purgatory.adapters.kafka import KafkaUnavailableError

    router = _router(purgatory, set())
    with pytest.raises(KafkaUnavailableError, match="group 'g' has not assigned one"):
        router.prepare("prices", timeout_ms=100)
    with pytest.raises(ValueError, match="topic"):
        _router(purgatory, {0}).prepare("", timeout_ms=100)
