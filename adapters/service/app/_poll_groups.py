"""PollGroups: equal long polls share one delayed operation; each waiter keeps its own deadline.

Why: a partition's long polls at its end are the same question asked thousands of times — same
partition, offset and limits — and Kafka's broker would hold one DelayedFetch per request. Held
one operation each, a key event completed 10,000 operations (their checks, their finish, their
hand-off to the loop, their answers' lookups) to give 10,000 times the same answer. As caches and
proxies coalesce equal requests, the service holds one operation per *group* of equal long polls
(issue 30): the first poll's operation, which the others join. Equal means every parameter that
changes the answer: the partition, the fetch offset, ``min_records``, ``min_bytes`` and
``max_bytes`` (:func:`equal_polls`); ``max_wait_ms`` does not (each waiter has its own deadline).

What stays per waiter (a :class:`PollWaiter`, ~100 bytes):

* its deadline. A group's operation waits :data:`GROUP_WAIT_FACTOR` times the longest wait the
  service admits, and takes a new waiter only while it outlives the waiter's deadline, so no
  waiter is answered by its group's timer. The group keeps its waiters in a heap by deadline and
  one loop timer for the earliest. A waiter whose deadline comes first gets the answer a lone
  long poll gets at its deadline: when the facts vouch that nothing arrived past the offset (no
  ``min_bytes``, the partition's high watermark *at* the offset) that is the empty EXPIRED answer
  of the group's *expired twin* (an operation made as the group's, never submitted, EXPIRED);
  otherwise (records may have arrived below a threshold, the partition not reported yet) a lone
  operation with no wait reads what is there, exactly as a lone poll's expiry does.
* its leaving: a waiter whose client left is taken out of its group; the group's operation is
  cancelled only when its last waiter leaves. It *expires* (Expires_total, the journal's
  EXPIRED) when its last waiter's deadline passes, answering that waiter as a lone poll's
  expiry does; the waiters whose deadlines came before were answered alone (above).
* exactly once: a waiter's callback runs once — with the group's finished operation, its twin,
  or its lone operation — or never, once it left.

A group is never joined once its operation finished (on any thread: ``op.outcome`` is set before
its callback reaches the loop); the next equal poll starts a new group.

Counting: the fetch purgatory holds one operation per group, so Kafka's ``PurgatorySize`` and
``NumDelayedOperations`` count groups (as the broker counts one DelayedFetch per request it
holds); :attr:`PollGroups.waiters` counts the waiting requests (admission, the drain's answers, the
``purgatory_service_long_poll_waiters`` gauge), and :attr:`PollGroups.per_key` them per partition
(the per-key limit). The journal records the purgatory's operations as it always did — a
group's operation stands for the waiter that started it — and, given one, this records each
waiter that *joined* a group when it is answered (a ``DelayedFetch`` answered with its group's
outcome, its latency from its own arrival), so a group of N waiters is N requests there too.

Concurrency contract: the event loop's thread only. Operations finish on any thread; their
callbacks (``submit``'s) reach the loop through the purgatory's loop handoff.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, cast

from purgatory import Outcome, PurgatoryFullError
from purgatory.journal import Journal

from ...kafka import DelayedFetch

if TYPE_CHECKING:
    from purgatory import DelayedOperation

__all__ = ["ANSWER_SLICE", "GROUP_WAIT_FACTOR", "PollGroup", "PollGroups", "PollWaiter", "equal_polls"]

# A group's operation waits this many times the longest admitted wait: a group takes waiters for
# (factor - 1) x that wait, then the next equal poll starts a new one (at most `factor` groups of
# equal polls at once). Its own deadline never answers a waiter: each has expired before.
GROUP_WAIT_FACTOR = 2
# Waiters answered per loop iteration when their group's operation finished: an HTTP/1.1 answer
# is written at once (~17 µs of the loop each), so 10,000 in one callback kept every other request
# — a produce, /healthz — waiting ~170 ms (issue 30: answered within 100 ms of a burst). Between
# slices the loop reads and answers them; the burst's own p99 hardly moves.
ANSWER_SLICE = 256
# A group rebuilds its heap once this share of it is waiters that left (they wait there for
# their deadline otherwise, holding their callbacks).
_STALE_SHARE = 0.5

Submit = Callable[[DelayedFetch, Callable[[DelayedFetch], None]], None]
Answered = Callable[[DelayedFetch], None]


def equal_polls(
    key: Hashable, offset: int, min_records: int, min_bytes: int | None, max_bytes: int
) -> tuple[Any, ...]:
    """What makes two long polls the same question: everything but their wait."""
    return (key, offset, min_records, min_bytes, max_bytes)


class PollWaiter:
    """One waiting long poll: its callback, its deadline (loop time), its group or lone operation."""

    __slots__ = ("callback", "deadline", "group", "joined_ns", "key", "op")

    def __init__(self, callback: Answered, deadline: float, key: Hashable) -> None:
        self.joined_ns = 0  # when it joined a group it did not start (the journal's latency), else 0
        self.callback: Answered | None = callback  # None once answered or gone: exactly once
        self.deadline = deadline
        self.key = key  # the partition's key (the per-key count)
        self.group: PollGroup | None = None  # None: answered, gone, or waiting on a lone operation
        self.op: DelayedFetch | None = None  # the operation it waits on (the group's, or its lone one)

    def __lt__(self, other: PollWaiter) -> bool:  # the group's heap: earliest deadline first
        return self.deadline < other.deadline


class PollGroup:
    """Equal long polls waiting on one operation (module docstring)."""

    __slots__ = ("equal", "heap", "joinable_until", "live", "make_op", "op", "owner", "timer", "twin")

    def __init__(
        self, owner: PollGroups, equal: Hashable, op: DelayedFetch, joinable_until: float, make_op: Any
    ) -> None:
        self.owner = owner
        self.equal = equal
        self.op = op
        self.joinable_until = joinable_until  # loop time: later deadlines start a new group
        self.make_op = make_op  # wait_ms -> an operation like op (the twin, lone expiries)
        self.heap: list[PollWaiter] = []
        self.live = 0
        self.timer: asyncio.TimerHandle | None = None
        self.twin: DelayedFetch | None = None  # the expired twin, made on the first expiry

    def joinable(self, deadline: float) -> bool:
        return self.op.outcome is None and deadline <= self.joinable_until

    def add(self, waiter: PollWaiter) -> None:
        waiter.group = self
        waiter.op = self.op
        self.live += 1
        heap = self.heap
        heapq.heappush(heap, waiter)
        if heap[0] is waiter:  # the earliest deadline now: the timer follows it
            self._arm(waiter.deadline)

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.owner.loop.call_at(when, self.expire_due)

    def remove(self, waiter: PollWaiter) -> None:
        """``waiter`` left: out of the group (its heap entry is dropped lazily)."""
        waiter.group = None
        self.live -= 1
        if self.live == 0:
            self.close()
            self.owner.abandon(self.op)  # the last one: nobody waits for the operation
        elif len(self.heap) > 16 and self.live < len(self.heap) * _STALE_SHARE:
            self.heap = [w for w in self.heap if w.group is self]
            heapq.heapify(self.heap)

    def close(self) -> None:
        """No more waiters will be answered through this group: out of the map, timer off."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.owner.forget(self)

    def finished(self, op: DelayedFetch) -> None:
        """The group's operation finished (on the loop): every waiter still here gets it, a slice
        of :data:`ANSWER_SLICE` per loop iteration (a waiter leaving meanwhile is not answered)."""
        self.close()
        pending, self.heap = self.heap, []
        self._answer_from(pending, 0, op)

    def _answer_from(self, pending: list[PollWaiter], start: int, op: DelayedFetch) -> None:
        owner = self.owner
        end = min(start + ANSWER_SLICE, len(pending))
        # PollGroups.answer for a slice at once: the slice's waiters are counted out in one step
        # (they share the group's partition) before any callback runs, as answer() does for one.
        callbacks: list[Answered] = []
        joined: list[int] = []
        taken = 0
        for i in range(start, end):
            waiter = pending[i]
            if waiter.group is self:
                waiter.group = None
                taken += 1
                callback = waiter.callback
                if callback is None:
                    continue  # left (its remove() was not called: only leave() clears it first)
                waiter.callback = None
                waiter.op = None  # no cycle left to the collector: op -> its callback -> waiter -> op
                callbacks.append(callback)
                if waiter.joined_ns:
                    joined.append(waiter.joined_ns)
        self.live -= taken
        if callbacks:
            owner.answered(pending[start].key, len(callbacks), op, joined)
            for callback in callbacks:
                try:
                    callback(op)
                except Exception as exc:  # one waiter's bug: the rest of the group is still answered
                    owner.loop.call_exception_handler(
                        {"message": "long-poll callback failed", "exception": exc, "callback": callback}
                    )
        if end < len(pending):
            owner.loop.call_soon(self._answer_from, pending, end, op)

    def expire_due(self) -> None:
        """The loop timer: answer every waiter whose own deadline passed (module docstring)."""
        self.timer = None
        heap = self.heap
        now = self.owner.loop.time()
        while heap and heap[0].deadline <= now:
            if heap[0].group is self and self.live == 1:
                # The last waiter: the group's operation expires with it, as a lone poll's does
                # (counted in Expires_total, journaled EXPIRED), and answers it (finished).
                self.owner.forget(self)  # joined no more: it is about to expire
                self.owner.expire_operation(self)
                return
            waiter = heapq.heappop(heap)
            if waiter.group is not self:
                continue  # left before
            waiter.group = None
            self.live -= 1
            self.owner.expire(self, waiter)
        while heap and heap[0].group is not self:
            heapq.heappop(heap)
        if self.live == 0:
            self.close()
            self.owner.abandon(self.op)  # a no-op if it finished meanwhile
            return
        if heap:
            self._arm(heap[0].deadline)

    def nothing_arrived(self) -> bool:
        """True when the facts vouch that an expiry now would answer no records (module docstring)."""
        op = self.op
        if op.min_bytes is not None or op.error is not None:
            return False
        (part,) = op.parts
        facts = op.facts.partition(part.key)
        if facts is None or facts.error is not None or op.facts.unavailable:
            return False
        start = facts.log_start_offset
        return facts.high_watermark == part.fetch_offset and (start is None or start <= part.fetch_offset)

    def expired_twin(self) -> DelayedFetch:
        """The EXPIRED, empty answer of this group's polls (made once, never submitted)."""
        twin = self.twin
        if twin is None:
            twin = self.twin = self.make_op(0)
            twin.parts[0].high_watermark = self.op.parts[0].fetch_offset
            twin.outcome = Outcome.EXPIRED
        return twin


class PollGroups:
    """The groups of equal long polls of one gateway (module docstring).

    ``submit(op, callback)`` watches an operation (``callback(op)`` on the loop once finished),
    ``abandon(op)`` cancels one. Both are the gateway's (the fetch purgatory's).
    """

    def __init__(
        self,
        submit: Submit,
        abandon: Callable[[DelayedFetch], object],
        purgatory: str,
        loop: asyncio.AbstractEventLoop | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.submit = submit
        self._abandon = abandon
        self.purgatory = purgatory  # its name, in a per-key refusal
        self.groups: dict[Hashable, PollGroup] = {}
        self.waiters = 0  # long polls waiting (grouped or on a lone operation)
        self.per_key: dict[Hashable, int] = {}
        self.groups_made = 0  # counters (tests, metrics): groups started, waiters that joined one
        self.joined = 0
        self.expired_alone = 0  # expiries answered by a lone operation (records may have arrived)
        self._loop = loop  # None: the running loop (a gateway may outlive a test's loop)
        self.journal = journal

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop given (tests), else the running one: every call is made on the loop's thread."""
        loop = self._loop
        return asyncio.get_running_loop() if loop is None else loop

    def join(
        self,
        equal: Hashable,
        key: Hashable,
        wait_ms: int,
        group_wait_ms: int,
        make_op: Callable[[int], DelayedFetch],
        callback: Answered,
        max_per_key: int | None = None,
    ) -> PollWaiter:
        """Wait for the answer of the poll ``equal`` names: in its group, or a new one.

        ``make_op(wait_ms)`` makes the operation of a new group (``group_wait_ms``), or a lone one.
        A poll that does not wait (``wait_ms`` 0) is a lone operation (its expiry reads what is
        there at once). Raises :class:`PurgatoryFullError` past ``max_per_key`` waiters on ``key``,
        and what ``submit`` raises (nothing is then waiting).
        """
        count = self.per_key.get(key, 0)
        if max_per_key is not None and count >= max_per_key:
            raise PurgatoryFullError(self.purgatory, count, max_per_key, key)
        loop = self.loop
        waiter = PollWaiter(callback, loop.time() + wait_ms / 1000, key)
        self._count(key, count + 1)
        try:
            if wait_ms == 0:
                self._wait_alone(waiter, make_op(0))
                return waiter
            group = self.groups.get(equal)
            if group is not None and group.joinable(waiter.deadline):
                group.add(waiter)
                self.joined += 1
                if self.journal is not None:
                    waiter.joined_ns = time.monotonic_ns()
                return waiter
            op = make_op(group_wait_ms)
            group = PollGroup(self, equal, op, loop.time() + group_wait_ms / 1000, make_op)
            self.groups[equal] = group
            self.groups_made += 1
            group.add(waiter)  # before submitting: an operation finished at once answers it
            try:
                self.submit(op, _Finished(group))
            except BaseException:
                waiter.group = None
                group.close()
                raise
        except BaseException:
            if waiter.callback is not None:  # not answered: nothing waits
                waiter.callback = None
                self._one_less(key)
            raise
        return waiter

    def _wait_alone(self, waiter: PollWaiter, op: DelayedFetch) -> None:
        waiter.op = op
        self.submit(op, _AnsweredAlone(self, waiter))

    def leave(self, waiter: PollWaiter) -> None:
        """The waiter's client left: out of its group (or its lone operation cancelled); never answered."""
        if waiter.callback is None:
            return  # answered already (or left)
        waiter.callback = None
        self._one_less(waiter.key)
        group = waiter.group
        if group is not None:
            group.remove(waiter)
        elif waiter.op is not None:
            self._abandon(waiter.op)

    def answer(self, waiter: PollWaiter, op: DelayedFetch) -> None:
        callback = waiter.callback
        if callback is None:
            return  # left (or answered): exactly once
        waiter.callback = None
        waiter.op = None  # no cycle left to the collector: op -> its callback -> waiter -> op
        self.answered(waiter.key, 1, op, [waiter.joined_ns] if waiter.joined_ns else [])
        callback(op)

    def answered(self, key: Hashable, n: int, op: DelayedFetch, joined_ns: list[int]) -> None:
        """:meth:`answer`'s counting for ``n`` waiters on ``key`` answered with ``op`` at once (their
        callbacks are about to run): out of the counts, and the joined ones journaled."""
        self._one_less(key, n)
        journal = self.journal
        if journal is not None and joined_ns and op.outcome is not None:
            keys = op.watch_keys()
            for ns in joined_ns:
                waiter = cast("DelayedOperation", _JoinedWaiter(op, ns))  # what the journal reads of one
                journal.record_unsubmitted(self.purgatory, waiter, keys)

    def expire(self, group: PollGroup, waiter: PollWaiter) -> None:
        """``waiter``'s own deadline passed before its group finished."""
        if group.nothing_arrived():
            self.answer(waiter, group.expired_twin())
            return
        self.expired_alone += 1
        waiter.joined_ns = 0  # the journal records its lone operation
        try:
            self._wait_alone(waiter, group.make_op(0))
        except Exception:
            # Refused (shutting down): the twin's answer, as the drain would give it.
            self.answer(waiter, group.expired_twin())

    def abandon(self, op: DelayedFetch) -> None:
        self._abandon(op)

    def expire_operation(self, group: PollGroup) -> None:
        """Expire ``group``'s operation now (its last waiter's deadline): on the loop when the facts
        vouch that its expiry reads nothing, else on the operation's attempts executor (the read)."""
        op = group.op
        attempts = getattr(op, "attempts", None)
        if attempts is None or group.nothing_arrived():
            op.run()  # the timer's expiry: EXPIRED, counted and journaled as any expiry
            return
        try:
            attempts.submit(op.run)
        except RuntimeError:  # the executor shut down (the service stops): the drain expires it
            op.run()

    def forget(self, group: PollGroup) -> None:
        if self.groups.get(group.equal) is group:
            del self.groups[group.equal]

    def _one_less(self, key: Hashable, n: int = 1) -> None:
        """``n`` waiters on ``key`` answered or gone. One dict lookup: it runs for every answer (or
        slice of a burst's answers), where ``_count`` would look the key up twice."""
        per_key = self.per_key
        count = per_key.get(key)
        if count is not None:
            n = min(n, count)
            self.waiters -= n
            if count > n:
                per_key[key] = count - n
            else:
                del per_key[key]

    def _count(self, key: Hashable, count: int) -> None:
        self.waiters += count - self.per_key.get(key, 0)
        if count > 0:
            self.per_key[key] = count
        else:
            self.per_key.pop(key, None)


class _Finished:
    """A group operation's callback; lets go of the group once called.

    Why not the bound ``group.finished``: the operation keeps its callback, the group its
    operation — a cycle only the cyclic collector frees, which the service runs rarely
    (``admission.gc_thresholds``), and each cycle held an answer (measured: +18 MB a round of
    4 MB answers, tests/service/test_min_bytes_memory.py).
    """

    __slots__ = ("group",)

    def __init__(self, group: PollGroup) -> None:
        self.group: PollGroup | None = group

    def __call__(self, op: DelayedFetch) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.finished(op)


class _AnsweredAlone:
    """A lone operation's callback (as :class:`_Finished`: no cycle through the waiter)."""

    __slots__ = ("groups", "waiter")

    def __init__(self, groups: PollGroups, waiter: PollWaiter) -> None:
        self.groups: PollGroups | None = groups
        self.waiter = waiter

    def __call__(self, op: DelayedFetch) -> None:
        groups, self.groups = self.groups, None
        if groups is not None:
            groups.answer(self.waiter, op)


class _JoinedWaiter:
    """A waiter that joined a group, as the journal records it: a DelayedFetch answered with its
    group's outcome, its latency from its own arrival (``requested_ns``)."""

    __slots__ = ("delay_ms", "op", "outcome", "requested_ns")

    def __init__(self, op: DelayedFetch, joined_ns: int) -> None:
        self.op = op
        self.outcome = op.outcome
        self.delay_ms = op.delay_ms
        self.requested_ns = joined_ns

    def answer_code(self) -> object:
        return self.op.answer_code()


# The journal and the analytics group events by class name: to them a waiter is a DelayedFetch.
_JoinedWaiter.__name__ = _JoinedWaiter.__qualname__ = DelayedFetch.__name__
