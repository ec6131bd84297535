"""The completion probe (``python -m purgatory.tools.bench.service.completion_probe``): each key event it
times completes every waiter it registered, once, and its figures are per-operation CPU times."""

from __future__ import annotations

import asyncio

import pytest
from purgatory.tools.bench.service.completion_probe import probe_once, trivial_once

WAITERS = 300


@pytest.mark.parametrize("once", [probe_once, trivial_once], ids=["long polls", "trivial operations"])
def test_a_key_event_completes_every_waiter_and_reports_cpu_per_operation(once: object) -> None:
    # probe_once/trivial_once wait for the N-th callback (a timeout raises), so returning at all
    # says every waiter was called back; the figures are CPU µs per operation on each thread.
    feed_us, loop_us = asyncio.run(once(WAITERS))  # type: ignore[operator]
    assert 0 < feed_us < 10_000
    assert 0 <= loop_us < 10_000
