"""AnswerBudget and HeldBodies: the bytes of answers held for slow readers, counted once each."""

from __future__ import annotations

import pytest
from purgatory.adapters.service.answers._budget import AnswerBudget, HeldBodies, memory_budget_exceeded


def test_an_answer_shared_by_many_holders_is_counted_once() -> None:
    budget = AnswerBudget(100, trim=False)
    answer = b"x" * 60
    for _ in range(5):
        budget.take(answer)
    assert budget.held == 60
    for _ in range(4):
        budget.give_back(answer)
    assert budget.held == 60, "still held by its last holder"
    budget.give_back(answer)
    assert budget.held == 0


def test_an_answer_that_would_pass_the_budget_does_not_fit_unless_nothing_is_held() -> None:
    budget = AnswerBudget(100, trim=False)
    big = b"b" * 150
    assert budget.fits(big), "nothing held: one answer larger than the budget still goes out"
    budget.take(big)
    assert budget.spent
    other = b"o" * 10
    assert not budget.fits(other), "a new answer past the budget is refused"
    assert budget.fits(big), "an answer already held costs nothing more"
    budget.give_back(big)
    assert budget.fits(other) and not budget.spent


def test_the_refusal_is_a_429_with_retry_after_and_its_code() -> None:
    budget = AnswerBudget(10, trim=False)
    budget.take(b"z" * 20)
    error = memory_budget_exceeded(budget, 3)
    assert error.status == 429
    assert error.code == "MEMORY_BUDGET_EXCEEDED"
    assert error.headers == {"Retry-After": "3"}
    assert "service.answer_budget_bytes" in error.message
    assert budget.refused == 1


def test_held_bodies_take_a_body_once_per_stream_and_give_it_back_on_every_way_out() -> None:
    budget = AnswerBudget(1_000, trim=False)
    held = HeldBodies(budget)
    body = b"a" * 300
    view = memoryview(body)
    held[1] = view
    held[1] = view[100:]  # less of the same body left: no second count
    held[3] = view
    assert budget.held == 300
    assert held.pop(1) is not None
    assert budget.held == 300, "stream 3 still holds it"
    other = b"c" * 200
    held[5] = memoryview(other)
    assert budget.held == 500
    held.clear()
    assert budget.held == 0 and not held


def test_large_answers_let_go_of_ask_the_allocator_to_return_pages() -> None:
    budget = AnswerBudget(1 << 30)
    if budget._trim is None:
        pytest.skip("no malloc_trim here (not glibc)")
    answer = b"t" * (9 * 1024 * 1024)
    budget.take(answer)
    budget.give_back(answer)
    assert budget.trims == 1
