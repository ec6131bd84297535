"""Synthetic journals with known answers: for the pipeline's tests and its benchmark.

``synthetic_events(n_ops, seed=…)`` yields, for each of ``n_ops`` operations, its ``created``
event and its finish event, as a purgatory would journal them (ops submitted uniformly over
``span_ms``; watch keys drawn with a skew so some keys are hot; outcome and latency drawn per
type). Deterministic for a seed, so a test can compute the exact expected aggregates from the
same events it writes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._event import EventType, JournalEvent

__all__ = ["DEFAULT_PROFILES", "OperationProfile", "synthetic_events", "write_jsonl"]

DEFAULT_START_MS = 1_795_305_600_000  # 2026-11-22T00:00:00Z: a realistic epoch for event time
DEFAULT_SPAN_MS = 10 * 60_000  # ten one-minute windows
KEY_POPULATION = 64  # distinct watch keys; drawn with a skew (below) so a few are clearly hottest


@dataclass(frozen=True, slots=True)
class OperationProfile:
    """How one operation type behaves: outcome odds and latency (log-normal, in ms)."""

    op_type: str
    purgatory: str
    timeout_ms: int
    p_expired: float
    p_cancelled: float
    median_latency_ms: float
    sigma: float
    keys_per_op: int


DEFAULT_PROFILES = (
    OperationProfile("DelayedProduce", "Produce", 30_000, 0.02, 0.0, 8.0, 0.8, 3),
    OperationProfile("DelayedFetch", "Fetch", 500, 0.30, 0.01, 40.0, 1.0, 1),
    OperationProfile("DelayedConsumerCommit", "ConsumerCommit", 10_000, 0.10, 0.05, 300.0, 1.2, 1),
)


def synthetic_events(
    n_ops: int,
    *,
    seed: int = 0,
    start_ms: int = DEFAULT_START_MS,
    span_ms: int = DEFAULT_SPAN_MS,
    profiles: tuple[OperationProfile, ...] = DEFAULT_PROFILES,
) -> Iterator[JournalEvent]:
    """``2 * n_ops`` events: each operation's ``created`` then its finish (in that order)."""
    if n_ops < 0:
        raise ValueError(f"n_ops must be >= 0, got {n_ops!r}")
    rng = random.Random(seed)
    for index in range(n_ops):
        profile = profiles[index % len(profiles)]
        op_id = f"syn{seed}-{index:x}"
        created_ms = start_ms + rng.randrange(span_ms)
        keys = tuple(f"topic-{_skewed_key(rng)}" for _ in range(profile.keys_per_op))
        draw = rng.random()
        if draw < profile.p_expired:
            event_type = EventType.EXPIRED
            latency = profile.timeout_ms + rng.random() * 5.0  # expiry is a little late, never early
        elif draw < profile.p_expired + profile.p_cancelled:
            event_type = EventType.CANCELLED
            latency = rng.random() * profile.timeout_ms
        else:
            event_type = EventType.COMPLETED
            latency = min(
                profile.median_latency_ms * math.exp(profile.sigma * rng.gauss(0.0, 1.0)),
                profile.timeout_ms - 1.0,
            )
        latency = round(latency, 3)
        yield JournalEvent(
            event_id=f"{op_id}:created",
            event_type=EventType.CREATED,
            op_id=op_id,
            op_type=profile.op_type,
            purgatory=profile.purgatory,
            ts_ms=created_ms,
            keys=keys,
            timeout_ms=profile.timeout_ms,
        )
        yield JournalEvent(
            event_id=f"{op_id}:{event_type.value}",
            event_type=event_type,
            op_id=op_id,
            op_type=profile.op_type,
            purgatory=profile.purgatory,
            ts_ms=created_ms + int(latency),
            latency_ms=latency,
        )


def _skewed_key(rng: random.Random) -> int:
    # Squaring a uniform draw piles the mass onto low key numbers: topic-0 is the hottest.
    return int(KEY_POPULATION * rng.random() ** 2)


def write_jsonl(path: str | Path, events: Iterator[JournalEvent] | list[JournalEvent]) -> int:
    """Write events as JSON lines to ``path``; returns how many were written."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for event in events:
            out.write(event.to_json())
            out.write("\n")
            count += 1
    return count
