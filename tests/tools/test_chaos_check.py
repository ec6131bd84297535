"""The chaos suite's schedule and checker on hand-made histories (no Kafka): a seed names one
schedule, and each kind of violation the checker exists for is found — and a clean history
passes."""

from __future__ import annotations

import itertools

from purgatory.tools.reliability._chaos_check import (
    CONNECTION,
    Bounds,
    CommitIssue,
    CommitWait,
    History,
    PollCall,
    ProduceCall,
    RequestCall,
    check,
)
from purgatory.tools.reliability._chaos_schedule import draw_schedule, format_schedule

BOUNDS = Bounds(request_timeout_s=2.0)
NODES = (1, 2, 3)


def test_a_seed_names_one_schedule_and_seeds_differ() -> None:
    assert draw_schedule(7, 30.0, NODES) == draw_schedule(7, 30.0, NODES)
    assert draw_schedule(7, 30.0, NODES) != draw_schedule(8, 30.0, NODES)


def test_schedule_hits_nodes_and_the_service_one_fault_at_a_time_within_the_load() -> None:
    faults = [f for seed in range(50) for f in draw_schedule(seed, 30.0, NODES)]
    assert {f.target for f in faults} == {None, 1, 2, 3}
    assert {f.action for f in faults} == {"kill", "pause", "stop", "bounce"}
    for seed in range(50):
        schedule = draw_schedule(seed, 30.0, NODES)
        for before, after in itertools.pairwise(schedule):
            assert after.at_s >= before.at_s + before.hold_s, "a fault starts before the last one healed"
        assert all(f.at_s < 28.0 for f in schedule)
    text = format_schedule(draw_schedule(3, 30.0, NODES), [(1.0, 2.5)])
    assert "[ran   1.00s -> healed   2.50s]" in text


def _clean() -> tuple[History, dict[int, list[tuple[int, str | None]]]]:
    history = History()
    history.produces.append(ProduceCall(0, [(0, "a"), (0, "b")], 8000, 0.0, 0.1, 200, [0, 1]))
    history.produces.append(ProduceCall(1, [(1, "c")], 8000, 0.0, 9.0, 504))  # written anyway: allowed
    history.produces.append(ProduceCall(2, [(1, "d")], 8000, 0.0, 0.01, CONNECTION))  # not written
    history.polls.append(PollCall(0, 0, 1000, 0.0, 0.2, 200, [(0, "a"), (1, "b")]))
    history.commit_waits.append(CommitWait(1, 5000, 0.0, 1.0, "committed"))
    history.commits.append(CommitIssue(1, 0.5))
    history.requests.append(RequestCall(b"q", 5000, 0.0, 0.1, "reply", b"echo:q"))
    log: dict[int, list[tuple[int, str | None]]] = {0: [(0, "a"), (1, "b")], 1: [(0, "c")]}
    return history, log


def test_a_clean_history_passes_and_counts_every_answer() -> None:
    history, log = _clean()
    result = check(history, log, committed=1, bounds=BOUNDS)
    assert result.ok, result.violations
    assert result.counts["produces"] == {"200": 1, "504": 1, CONNECTION: 1}


def test_an_acknowledged_record_missing_duplicated_or_moved_is_a_violation() -> None:
    history, log = _clean()
    log[0] = [(0, "a")]  # "b" lost
    assert any("'b'" in v for v in check(history, log, 1, BOUNDS).violations)
    history, log = _clean()
    log[1] = [(0, "c"), (1, "c")]  # the 504's record written twice
    assert any("2 times" in v for v in check(history, log, 1, BOUNDS).violations)
    history, log = _clean()
    log[0] = [(0, "b"), (1, "a")]  # a request's records reordered
    assert any("sent earlier" in v for v in check(history, log, 1, BOUNDS).violations)
    history, log = _clean()
    log[1].append((1, "zz"))
    assert any("never sent" in v for v in check(history, log, 1, BOUNDS).violations)


def test_a_long_poll_answer_that_differs_from_the_log_or_skips_is_a_violation() -> None:
    history, log = _clean()
    history.polls[0].records = [(0, "a"), (1, "x")]
    assert any("the log has 'b'" in v for v in check(history, log, 1, BOUNDS).violations)
    history, log = _clean()
    history.polls[0].records = [(1, "b")]
    assert any("not contiguous" in v for v in check(history, log, 1, BOUNDS).violations)
    history, log = _clean()
    history.polls[0].records = [(0, "a"), (1, "b"), (2, "c")]  # past the log's end
    assert any("not in the log" in v for v in check(history, log, 1, BOUNDS).violations)


def test_a_late_or_missing_answer_is_a_violation() -> None:
    history, log = _clean()
    history.polls[0].elapsed_s = 1.0 + 2.0 + 2.0 + 0.3  # max_wait + request timeout + 2 s, passed
    assert any("bound 5.00 s" in v for v in check(history, log, 1, BOUNDS).violations)
    history, log = _clean()
    history.produces[2].elapsed_s = None
    assert any("no answer at all" in v for v in check(history, log, 1, BOUNDS).violations)


def test_a_commit_wait_answered_before_its_commit_or_a_crossed_reply_is_a_violation() -> None:
    history, log = _clean()
    history.commits[0].issued_s = 1.5  # after the answer at 1.0
    assert any("before any commit" in v for v in check(history, log, 1, BOUNDS).violations)
    history, log = _clean()
    assert any("committed offset is 0" in v for v in check(history, log, 0, BOUNDS).violations)
    history, log = _clean()
    history.requests[0].reply = b"echo:other"
    assert any("not its own echo" in v for v in check(history, log, 1, BOUNDS).violations)
