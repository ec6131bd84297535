"""What completing one key event's long polls costs the change feed's thread and the event loop.

``python -m purgatory.tools.bench.service.completion_probe -n 10000 -r 7``

``bench fanout`` measures the service's CPU per answer end to end, with Kafka, the HTTP/2 path and
the client on the same two cores. This probe isolates the part issue 12's p99 hinges on: N
:class:`OffLoopFetch` long polls (the service's operation) wait on one partition of a fake
cluster view, each with a task-free callback on a running event loop (as the protocol-level long
polls are parked); the record is put in the shared record cache as the tail puts it, the high
watermark moves, and the feed's key event runs on a thread of its own, as the tail's thread runs
it in the service. Printed per run and as medians: the feed thread's CPU per completed long poll
(``time.thread_time``) and the loop thread's (hand-offs and the trivial callbacks: no HTTP).
No Kafka, no sockets; the median of several runs, since the machine may be shared.

``--trivial``: the same key event over operations that complete when tried and answer nothing,
the cost of one operation per request in the core alone (the floor under the figure above).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import typer
from purgatory.adapters.kafka import (
    ChangeFeed,
    ClusterFacts,
    FetchedRecord,
    PartitionFacts,
    SharedReadReader,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import OffLoopFetch

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory._loop_handoff import handoff_burst

__all__ = ["main", "probe_once"]

KEY = TopicPartitionKey("probe", 0)
AT = 5  # the long polls wait at the partition's end; the record appended there answers them
RECORD_BYTES = 100
DONE_TIMEOUT_S = 60.0


class _View:
    """A cluster view whose one partition's facts the probe sets (the feed polls it; no tail)."""

    request_timeout_s = 1.0

    def __init__(self) -> None:
        self.high_watermark = AT

    def facts(self, parts: Sequence[TopicPartitionKey], *_: Any, **__: Any) -> ClusterFacts:
        facts = PartitionFacts(
            high_watermark=self.high_watermark, leader=1, leader_epoch=1, isr=(1,), min_insync_replicas=1
        )
        return ClusterFacts(partitions={k: facts for k in parts if k == KEY})

    def retain_groups(self, groups: Any) -> None:
        pass

    def reconnect(self) -> None:
        pass


class _Trivial(DelayedOperation):
    """The floor: an operation that completes as soon as it is tried and answers nothing."""

    __slots__ = ()

    ready = False  # set once the waiters are registered: the key event's try completes them

    def try_complete(self) -> bool:
        return self.force_complete() if _Trivial.ready else False

    def on_complete(self) -> None:
        pass


class _Answered:
    """The waiters' callback: counts calls and sets ``done`` at the ``n``-th."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.done = asyncio.Event()

    def __call__(self, _: Any) -> None:
        self.count += 1
        if self.count == self.n:
            self.done.set()


async def _timed_key_event(key_event: Callable[[], object], answered: _Answered) -> tuple[float, float]:
    """Run ``key_event`` on a thread of its own until every waiter is called back on this loop:
    (its thread's CPU µs, the loop thread's CPU µs) per waiter."""
    feed_cpu: list[float] = []

    def timed() -> None:
        started = time.thread_time()
        key_event()
        feed_cpu.append(time.thread_time() - started)

    loop_started = time.thread_time()
    event = threading.Thread(target=timed, name="probe-feed")
    event.start()
    await asyncio.wait_for(answered.done.wait(), DONE_TIMEOUT_S)
    event.join(DONE_TIMEOUT_S)
    loop_cpu = time.thread_time() - loop_started
    return 1e6 * feed_cpu[0] / answered.n, 1e6 * loop_cpu / answered.n


async def trivial_once(n: int) -> tuple[float, float]:
    """``n`` trivial operations on one key, one key event: (feed thread µs, loop µs) per operation.

    What one operation per request costs in the core alone (``check_and_complete``, the claim,
    the timer's cancel, the hand-off): the floor under :func:`probe_once`'s figure.
    """
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory("floor", reaper_enabled=False)
    answered = _Answered(n)
    _Trivial.ready = False
    try:
        for _ in range(n):
            purgatory.watch_then_call(_Trivial(60_000), (KEY,), answered)
        _Trivial.ready = True

        def key_event() -> None:
            with handoff_burst():  # as the change feed wraps its key events
                purgatory.check_and_complete(KEY)

        return await _timed_key_event(key_event, answered)
    finally:
        _Trivial.ready = False
        purgatory.shutdown()


async def probe_once(n: int) -> tuple[float, float]:
    """One key event completing ``n`` long polls: (feed thread µs, loop thread µs) per long poll."""
    view = _View()
    feed = ChangeFeed(view, settings=KafkaSettings(), name="probe")
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory("fetch", reaper_enabled=False)
    feed.attach(purgatory)
    # Never connects: every read is served from the span the "tail" appended below.
    reader = SharedReadReader(KafkaSettings(), bootstrap_servers="127.0.0.1:1")
    attempts = ThreadPoolExecutor(1)
    try:
        feed.poll_once()  # first facts of the key
        answered = _Answered(n)
        loop_thread = threading.get_ident()
        for _ in range(n):
            op = OffLoopFetch(
                feed, reader, {KEY: AT}, max_wait_ms=60_000, loop_thread=loop_thread, attempts=attempts
            )
            purgatory.watch_then_call(op, op.watch_keys(), answered)
        reader.append(KEY, [FetchedRecord(AT, b"k", b"v" * RECORD_BYTES, 0)])
        view.high_watermark = AT + 1
        return await _timed_key_event(feed.poll_once, answered)
    finally:
        feed.detach(purgatory)
        purgatory.shutdown()
        attempts.shutdown()


def main(
    waiters: Annotated[int, typer.Option("--waiters", "-n", min=1, max=100_000)] = 10_000,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1, max=50)] = 7,
    trivial: Annotated[
        bool, typer.Option("--trivial", help="Trivial operations instead: the core's floor per operation.")
    ] = False,
) -> None:
    """Feed-thread and loop-thread CPU per long poll completed by one key event (module docstring)."""
    once = trivial_once if trivial else probe_once
    runs = [asyncio.run(once(waiters)) for _ in range(repeats)]
    what = "trivial operation" if trivial else "long poll"
    for i, (feed_us, loop_us) in enumerate(runs, 1):
        print(f"run {i}: feed thread {feed_us:.2f} µs, loop {loop_us:.2f} µs per {what}")
    feed_median = statistics.median(f for f, _ in runs)
    loop_median = statistics.median(lp for _, lp in runs)
    medians = f"feed thread {feed_median:.2f} µs, loop {loop_median:.2f} µs"
    print(f"median of {repeats} ({waiters} waiters): {medians}")


if __name__ == "__main__":  # pragma: no cover
    typer.run(main)
    sys.exit(0)
