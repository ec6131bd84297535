"""Faults without Kafka: every user callback raising, many times, on a real purgatory."""

from __future__ import annotations

from purgatory.reliability._faults import FAULTY_OPS_PER_KIND, callback_faults


def test_exceptions_from_every_user_callback_never_stop_the_purgatory() -> None:
    """try_complete (at submission and on key events), on_complete, on_expiration and a listener
    all raise; the purgatory keeps serving, each affected op ends once with a clear outcome, and
    every failure is counted and logged."""
    result = callback_faults()
    assert result.survived, result.problems
    assert result.outcomes == {
        "expired": 2 * FAULTY_OPS_PER_KIND,  # try_complete raising on events, on_expiration raising
        "completed": 4 * FAULTY_OPS_PER_KIND,  # on_complete raising, and every healthy neighbour
        "refused (raised to the caller)": FAULTY_OPS_PER_KIND,  # try_complete raising at submission
    }
    assert result.user_code_errors == 3 * FAULTY_OPS_PER_KIND
    assert result.logged_errors >= result.user_code_errors
