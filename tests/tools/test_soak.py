"""Soak: a million operations from eight threads — nothing lost, nothing twice, nothing retained.

Bounded for CI (the default load runs in about 15 s on 2 cores). Longer runs, by environment:

* ``RELIABILITY_SOAK_OPERATIONS`` — operations per round (default 1,000,000);
* ``RELIABILITY_SOAK_SECONDS`` — keep running rounds, each checked, until this many seconds passed
  (default: one round). The test's timeout follows.
"""

from __future__ import annotations

import os
import threading

import pytest
from purgatory.tools.reliability import run_soak

OPERATIONS = int(os.environ.get("RELIABILITY_SOAK_OPERATIONS", "1000000"))
SOAK_SECONDS = float(os.environ.get("RELIABILITY_SOAK_SECONDS", "0"))
THREADS = 8
EXPIRE_FRACTION = 0.3
CI_BOUND_S = 180  # the bound on the soak in CI


@pytest.mark.soak
@pytest.mark.timeout(CI_BOUND_S + SOAK_SECONDS * 1.5)
def test_soak_loses_nothing_finishes_nothing_twice_and_gives_memory_back() -> None:
    """Attacks every window at once under sustained load: submit vs key event on shared keys,
    key event vs expiry, completion vs the reaper's purge, and finishing vs unwatching other keys."""
    import time

    deadline = time.monotonic() + SOAK_SECONDS
    round_no = 0
    while True:
        result = run_soak(OPERATIONS, THREADS, expire_fraction=EXPIRE_FRACTION, seed=round_no)
        summary = result.as_dict()
        assert result.errors == [], f"round {round_no}: {result.errors}"
        assert result.lost == 0, f"round {round_no}: {result.lost} operations never finished: {summary}"
        assert result.double == 0, f"round {round_no}: {result.double} operations finished twice: {summary}"
        assert result.wrong_expirations == 0, "on_expiration runs exactly for the expired operations"
        assert result.completed + result.expired == OPERATIONS
        # ~30% expire by construction; the rest complete by key events or at once.
        assert abs(result.expired / OPERATIONS - EXPIRE_FRACTION) < 0.02, summary
        assert result.watched_after_purge == 0, "watched() is back to 0 after purge_completed()"
        assert result.delayed_after_finish == 0, "num_delayed() is back to 0 once everything finished"
        assert result.threads_left == [], f"threads left behind: {result.threads_left}"
        assert result.blocks_retained <= result.blocks_tolerance, (
            f"{result.blocks_retained} live blocks retained (allowed {result.blocks_tolerance}): a leak"
        )
        retained, tolerance = result.rss_retained_bytes, result.rss_tolerance_bytes
        assert retained is not None and tolerance is not None, "RSS must be measurable here (psutil)"
        growth = (result.rss_peak_bytes or 0) - (result.rss_start_bytes or 0)
        assert retained <= tolerance, (
            f"RSS stayed {retained / 2**20:.1f} MiB above its start (allowed {tolerance / 2**20:.1f} MiB, "
            f"peak growth {growth / 2**20:.1f} MiB)"
        )
        print(
            f"soak round {round_no}: {OPERATIONS} ops, {THREADS} threads, {result.seconds:.1f} s, "
            f"{result.ops_per_second:,.0f} ops/s, lost 0, double 0, RSS retained "
            f"{retained / 2**20:.1f} MiB of {tolerance / 2**20:.1f} MiB allowed"
        )
        round_no += 1
        if time.monotonic() >= deadline:
            break
    assert not [t for t in threading.enumerate() if t.name.startswith("soak-submitter")]
