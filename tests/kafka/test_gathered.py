"""GatheredRecords: what fetches waiting for ``min_bytes`` hold is counted once per batch, bounded,
and given back however the fetch ends (issue 31, item 1).

The ledger alone, then :class:`DelayedFetch` over a record cache served from memory (no Kafka:
the offset index's fake view, the feed driven by ``poll_once``, a purgatory on a MockTimer).
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from purgatory.adapters.kafka import DelayedFetch, FetchedRecord
from purgatory.adapters.kafka.facts._gathered import POINTER_BYTES, RECORD_OVERHEAD, GatheredRecords, Holding
from purgatory.adapters.kafka.facts._record_cache import SharedReadReader
from purgatory.adapters.kafka.ops._results import ErrorCode
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import Outcome
from tests.kafka.test_offset_index import KEY, _facts, feed_on_mock_timer

VALUE = 1_000  # bytes of each record's value (its key: 1 byte)


def _batch(start: int, count: int = 10) -> list[FetchedRecord]:
    return [FetchedRecord(offset, b"k", b"v" * VALUE, 0) for offset in range(start, start + count)]


def _taken(batch: list[FetchedRecord]) -> tuple[list[FetchedRecord], int]:
    return batch, GatheredRecords.cost(batch, sum(r.size for r in batch))


BATCH_COST = 10 * (1 + VALUE + RECORD_OVERHEAD)


# -- the ledger -------------------------------------------------------------------------------


def test_a_batch_many_holders_took_is_counted_once_and_freed_with_its_last_holder() -> None:
    ledger = GatheredRecords(10 * BATCH_COST)
    batch = _batch(0)
    holdings = [Holding() for _ in range(1_000)]
    for holding in holdings:
        assert ledger.take(holding, [_taken(batch)], 0)
    assert (ledger.held_bytes, ledger.batches) == (BATCH_COST, 1), "one batch, however many hold it"
    for holding in holdings[:-1]:
        ledger.give_back(holding)
    assert ledger.held_bytes == BATCH_COST, "still held by one fetch"
    ledger.give_back(holdings[-1])
    assert (ledger.held_bytes, ledger.batches) == (0, 0)


def test_equal_records_in_another_list_count_again() -> None:
    """Counting is by the list's identity: an upper bound of what is held, never an under-count."""
    ledger = GatheredRecords(10 * BATCH_COST)
    assert ledger.take(Holding(), [_taken(_batch(0))], 0)
    assert ledger.take(Holding(), [_taken(_batch(0))], 0)
    assert ledger.held_bytes == 2 * BATCH_COST


def test_a_take_past_the_limit_is_refused_whole_and_a_batch_already_counted_still_fits() -> None:
    ledger = GatheredRecords(BATCH_COST + BATCH_COST // 2)
    first, second = _batch(0), _batch(10)
    assert ledger.take(Holding(), [_taken(first)], 0)
    late = Holding()
    assert not ledger.take(late, [_taken(first), _taken(second)], 0), "the second batch does not fit"
    assert (ledger.held_bytes, ledger.refusals, late.batches) == (BATCH_COST, 1, []), "nothing of it counted"
    assert ledger.take(late, [_taken(first)], 0), "a batch counted already costs nothing more"
    assert ledger.peak_bytes == BATCH_COST <= ledger.max_bytes


def test_own_references_are_charged_per_holder_and_given_back() -> None:
    ledger = GatheredRecords(BATCH_COST)
    holding = Holding()
    assert ledger.take(holding, [], 20 * POINTER_BYTES)
    assert ledger.take(holding, [], 30 * POINTER_BYTES), "only the growth is new"
    assert ledger.held_bytes == 30 * POINTER_BYTES
    assert not ledger.take(Holding(), [], BATCH_COST), "own bytes are not shared: they can pass the limit"
    ledger.give_back(holding)
    assert ledger.held_bytes == 0


def test_a_holding_given_back_takes_nothing_more_and_gives_back_once() -> None:
    """The race of a take on the feed's thread with an expiry's give-back on the timer's."""
    ledger = GatheredRecords(10 * BATCH_COST)
    batch = _batch(0)
    other = Holding()
    assert ledger.take(other, [_taken(batch)], 0)
    holding = Holding()
    assert ledger.take(holding, [_taken(batch)], 0)
    ledger.give_back(holding)
    ledger.give_back(holding)
    assert ledger.held_bytes == BATCH_COST, "a second give-back frees nothing another holder holds"
    assert not ledger.take(holding, [_taken(_batch(10))], 0)
    assert ledger.held_bytes == BATCH_COST


def test_limits_are_checked() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_bytes"):
            GatheredRecords(bad)  # type: ignore[arg-type]


def test_concurrent_takes_and_give_backs_never_pass_the_limit_and_end_at_zero() -> None:
    ledger = GatheredRecords(3 * BATCH_COST)
    pool = [_taken(_batch(10 * i)) for i in range(6)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait(10)
            for _ in range(2_000):
                holding = Holding()
                for _ in range(rng.randint(1, 3)):
                    ledger.take(
                        holding, rng.sample(pool, rng.randint(1, 2)), rng.randint(0, 50) * POINTER_BYTES
                    )
                assert ledger.held_bytes <= ledger.max_bytes
                ledger.give_back(holding)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors
    assert (ledger.held_bytes, ledger.batches) == (0, 0), "every take given back"
    assert 0 < ledger.peak_bytes <= ledger.max_bytes
    assert ledger.refusals > 0, "the limit was reached (the test exercises refusals)"


# -- DelayedFetch over the ledger ---------------------------------------------------------------

AT = 5
WAITERS = 100
# Two rounds of a 10-record batch fit (one batch each, shared, plus each fetch's own list of 20
# references once it joined the second to the first), a third batch does not.
LIMIT = 2 * BATCH_COST + WAITERS * 20 * POINTER_BYTES + BATCH_COST // 2


@pytest.fixture
def rig() -> Any:
    with feed_on_mock_timer("fetch", "gathered") as (view, feed, purgatory, timer):
        # served from memory only: every read below is of records appended first
        reader = SharedReadReader(KafkaSettings(), bootstrap_servers="127.0.0.1:1", gathered_max_bytes=LIMIT)
        view.partitions[KEY] = _facts(AT)
        feed.poll_once()
        yield view, feed, purgatory, timer, reader


def _append(view: Any, feed: Any, reader: SharedReadReader, start: int) -> None:
    reader.append(KEY, _batch(start))  # the tail: records before facts
    view.partitions[KEY] = _facts(start + 10)
    feed.poll_once()


def _waiting(
    feed: Any, purgatory: Any, reader: SharedReadReader, count: int, **kwargs: Any
) -> list[DelayedFetch]:
    ops = []
    for i in range(count):
        # Distinct min_bytes (as distinct clients'), all above what is produced here.
        op = DelayedFetch(feed, reader, {KEY: AT}, min_bytes=1_000_000 + i, max_bytes=2_000_000, **kwargs)
        assert not purgatory.try_complete_else_watch(op, op.watch_keys())
        ops.append(op)
    return ops


def test_waiters_share_one_counted_batch_and_are_answered_early_past_the_limit(rig: Any) -> None:
    view, feed, purgatory, timer, reader = rig
    ledger = reader.gathered
    assert ledger is not None
    ops = _waiting(feed, purgatory, reader, WAITERS, max_wait_ms=60_000)
    _append(view, feed, reader, AT)
    assert not any(op.is_completed() for op in ops)
    assert (ledger.batches, ledger.held_bytes) == (1, BATCH_COST), "the waiters' first read: one list"
    _append(view, feed, reader, AT + 10)
    assert not any(op.is_completed() for op in ops)
    assert ledger.held_bytes == 2 * BATCH_COST + WAITERS * 20 * POINTER_BYTES
    _append(view, feed, reader, AT + 20)
    # The third batch does not fit: the first waiters are answered at once, and each gives back
    # its own list as it is answered — until there is room for the batch again (the rest wait).
    early = [op for op in ops if op.is_completed()]
    assert 0 < len(early) == ledger.refusals < WAITERS
    assert all(op.outcome is Outcome.COMPLETED for op in early), "answered, not expired or failed"
    assert ledger.held_bytes <= LIMIT
    timer.advance_clock(60_001)
    assert all(op.outcome is Outcome.EXPIRED for op in ops if op not in early)
    for op in ops:
        result = op.result()
        assert result.statuses[KEY] is ErrorCode.NONE
        assert [r.offset for r in result.records[KEY]] == list(range(AT, AT + 30)), "with all it read"
    assert (ledger.held_bytes, ledger.batches) == (0, 0), "given back as they were answered"
    assert ledger.peak_bytes <= LIMIT


@pytest.mark.parametrize("end", ["expire", "cancel", "move"])
def test_a_waiting_fetch_gives_its_records_back_however_it_ends(rig: Any, end: str) -> None:
    from purgatory.adapters.kafka.ops._moved import Moved

    view, feed, purgatory, timer, reader = rig
    ledger = reader.gathered
    assert ledger is not None
    ops = _waiting(feed, purgatory, reader, 3, max_wait_ms=1_000)
    _append(view, feed, reader, AT)
    assert ledger.held_bytes == BATCH_COST
    if end == "expire":
        timer.advance_clock(1_001)
        expected = Outcome.EXPIRED
    elif end == "cancel":
        for op in ops:
            purgatory.abandon(op)
        expected = Outcome.CANCELLED
    else:
        for op in ops:
            assert op.move(Moved("revoked"))
        expected = Outcome.COMPLETED
    assert all(op.outcome is expected for op in ops)
    assert (ledger.held_bytes, ledger.batches) == (0, 0)


def test_fetches_without_min_bytes_or_answered_by_their_first_read_take_nothing(rig: Any) -> None:
    view, feed, purgatory, _, reader = rig
    ledger = reader.gathered
    assert ledger is not None
    plain = DelayedFetch(feed, reader, {KEY: AT}, max_wait_ms=60_000)
    one_byte = DelayedFetch(feed, reader, {KEY: AT}, min_bytes=1, max_wait_ms=60_000)
    for op in (plain, one_byte):
        assert not purgatory.try_complete_else_watch(op, op.watch_keys())
    _append(view, feed, reader, AT)
    assert plain.outcome is one_byte.outcome is Outcome.COMPLETED
    assert (ledger.peak_bytes, plain.gathered, one_byte.gathered) == (0, None, None)


def test_a_gathered_bound_without_shared_reads_is_refused_by_name() -> None:
    from purgatory.adapters.kafka import KafkaPurgatory

    with pytest.raises(ValueError, match=r"gathered_max_bytes.*shared_reads=True"):
        KafkaPurgatory.connect(KafkaSettings(bootstrap_servers="127.0.0.1:1"), gathered_max_bytes=1 << 20)


def test_a_refused_submission_gives_back_what_its_first_try_took(rig: Any) -> None:
    from purgatory import PurgatoryFullError

    view, feed, purgatory, timer, reader = rig
    ledger = reader.gathered
    assert ledger is not None
    (waiting,) = _waiting(feed, purgatory, reader, 1, max_wait_ms=1_000)  # the feed follows KEY
    _append(view, feed, reader, AT)
    assert ledger.held_bytes == BATCH_COST
    purgatory.max_pending = 1
    # Another offset: its first try reads another list of the records there, and holds it.
    op = DelayedFetch(feed, reader, {KEY: AT + 5}, min_bytes=1_000_000, max_wait_ms=60_000)
    with pytest.raises(PurgatoryFullError):
        purgatory.try_complete_else_watch(op, op.watch_keys())
    assert ledger.held_bytes > BATCH_COST, "the first try ran before the refusal, and took its records"
    op.on_refused()  # what KafkaPurgatory's submit, watch and watch_then_call do on a refusal
    assert ledger.held_bytes == BATCH_COST, "nothing kept for an op nothing will finish"
    op.on_refused()
    assert ledger.held_bytes == BATCH_COST, "once"
    timer.advance_clock(1_001)
    assert waiting.outcome is Outcome.EXPIRED
    assert (ledger.held_bytes, ledger.batches) == (0, 0)
