"""What a chaos seed's clients saw (the history) and the checker that holds it against the log.

The runner records every call as it was answered — status, what the answer said, how long it
took — and, once the faults stopped and the cluster healed, reads every partition back with a
plain consumer. :func:`check` then lists the violations (an empty list: the seed passed):

* **produces**: each record of a produce answered 200 is in the log exactly once, at the offset
  the answer gave, and a request's records to one partition are in the request's order. Any
  record, answered or not (503, 504, a connection cut by a service bounce), is in the log at most
  once; nothing is in the log that nobody sent.
* **long polls**: a 200's records are the log's records at their offsets, contiguous from the
  offset asked for (nothing skipped, nothing read that the log does not keep: a read past the
  high watermark that a failover then truncated shows up here).
* **commit waits**: one answered "committed" only after a commit reaching its target was issued,
  and the group's committed offset afterwards is at least every target answered so.
* **request-reply**: a reply is the echo of its own request (no crossed correlation ids).
* **bounds**: every call was answered (a status or a connection error) within its bound —
  ``Bounds`` — and none is left without an answer.

Answers other than 200 are allowed and counted (``counts``); they are what an outage may cost.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "Bounds",
    "CheckResult",
    "CommitIssue",
    "CommitWait",
    "History",
    "PollCall",
    "ProduceCall",
    "RequestCall",
    "check",
]

NO_ANSWER = "no answer"  # the call was still open when the run gave up on it
CONNECTION = "connection error"  # refused or cut (a service bounce): allowed, never a hang


@dataclass(frozen=True)
class Bounds:
    """The documented answer bounds the checker holds calls to.

    A long poll: ``max_wait_ms + kafka.request_timeout_ms + 2 s`` (README, "one read"). A produce:
    its ``timeout_ms`` plus the same read and slack (the producer retries within ``timeout_ms``;
    the answer then needs one more round to the service). A commit wait likewise; a request-reply
    call: its ``timeout_ms`` plus the slack.

    ``measure_s``: the answer time is measured by the load's client, whose event loop shares two
    busy cores with three JVMs, the service and the library's threads; a call counts as late
    only past its bound plus this (a few scheduling quanta), so that the checker reports the
    service's lateness, not the client's.
    """

    request_timeout_s: float
    slack_s: float = 2.0
    measure_s: float = 0.25

    def poll(self, max_wait_ms: int) -> float:
        return max_wait_ms / 1000 + self.request_timeout_s + self.slack_s

    def produce(self, timeout_ms: int) -> float:
        return timeout_ms / 1000 + self.request_timeout_s + self.slack_s

    def commit(self, timeout_ms: int) -> float:
        return timeout_ms / 1000 + self.request_timeout_s + self.slack_s

    def request(self, timeout_ms: int) -> float:
        return timeout_ms / 1000 + self.slack_s


@dataclass
class ProduceCall:
    """``POST /topics/{t}/records``: the records sent (partition, unique value) and the answer."""

    request_id: int
    records: list[tuple[int, str]]
    timeout_ms: int
    started_s: float
    elapsed_s: float | None = None  # None: never answered
    status: int | str = NO_ANSWER  # the HTTP status, or CONNECTION / NO_ANSWER
    offsets: list[int | None] = field(default_factory=list)  # per record, from a 200's body


@dataclass
class PollCall:
    """``GET .../records?offset=``: what a long poll asked for and the records it was answered."""

    partition: int
    offset: int
    max_wait_ms: int
    started_s: float
    elapsed_s: float | None = None
    status: int | str = NO_ANSWER
    records: list[tuple[int, str | None]] = field(default_factory=list)


@dataclass
class CommitIssue:
    """A commit of ``offset`` for the commit waits' group, issued at ``issued_s`` (it may fail)."""

    offset: int
    issued_s: float


@dataclass
class CommitWait:
    """``wait_committed(group, {partition 0: target})`` and its answer."""

    target: int
    timeout_ms: int
    started_s: float
    elapsed_s: float | None = None
    status: str = NO_ANSWER  # "committed", "timed out", "unavailable", an error's type name

    @property
    def answered_s(self) -> float | None:
        return None if self.elapsed_s is None else self.started_s + self.elapsed_s


@dataclass
class RequestCall:
    """``request(topic, value)`` through the library, answered by an echoing responder."""

    value: bytes
    timeout_ms: int
    started_s: float
    elapsed_s: float | None = None
    status: str = NO_ANSWER  # "reply", "timed out", an error's type name
    reply: bytes | None = None


@dataclass
class History:
    """Every call of one seed, in the order they were started."""

    produces: list[ProduceCall] = field(default_factory=list)
    polls: list[PollCall] = field(default_factory=list)
    commit_waits: list[CommitWait] = field(default_factory=list)
    commits: list[CommitIssue] = field(default_factory=list)
    requests: list[RequestCall] = field(default_factory=list)


@dataclass
class CheckResult:
    violations: list[str]
    counts: dict[str, collections.Counter[str]]

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        parts = []
        for kind, counter in self.counts.items():
            total = sum(counter.values())
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counter.items(), key=lambda kv: -kv[1]))
            parts.append(f"{kind} {total} ({detail})" if total else f"{kind} 0")
        return "; ".join(parts)


class _Timed(Protocol):
    """A call of any kind, as the bound check reads it."""

    @property
    def started_s(self) -> float: ...
    @property
    def elapsed_s(self) -> float | None: ...
    @property
    def status(self) -> int | str: ...


Log = dict[int, list[tuple[int, str | None]]]  # partition -> (offset, value) in offset order


def _late(kind: str, what: str, call: _Timed, bound: float, bounds: Bounds) -> str | None:
    started, elapsed, status = call.started_s, call.elapsed_s, call.status
    if elapsed is None:
        return f"{kind} {what} sent at t={started:.2f}s: no answer at all (left open past {bound:.1f} s)"
    if elapsed > bound + bounds.measure_s:
        return (
            f"{kind} {what} sent at t={started:.2f}s: answered {status} after {elapsed:.2f} s, "
            f"bound {bound:.2f} s"
        )
    return None


def _check_produces(history: History, log: Log, bounds: Bounds, out: list[str]) -> None:
    where: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for partition, records in log.items():
        for offset, value in records:
            if value is not None:
                where[value].append((partition, offset))
    sent = {value for call in history.produces for _, value in call.records}
    for value, places in where.items():
        if len(places) > 1:
            out.append(f"produce: record {value!r} is in the log {len(places)} times, at {places}")
        if value not in sent:
            out.append(f"produce: record {value!r} at {places} was never sent")
    for call in history.produces:
        name = f"#{call.request_id}"
        late = _late("produce", name, call, bounds.produce(call.timeout_ms), bounds)
        if late:
            out.append(late)
        if call.status == 200:
            for (partition, value), answered in zip(call.records, call.offsets, strict=True):
                # None: delivered, offset not reported — librdkafka's idempotent producer reports
                # a retried batch the broker already had (a duplicate sequence) as delivered with
                # no offset; the record must still be in the log exactly once, in that partition.
                places = where.get(value, [])
                placed = len(places) == 1 and places[0][0] == partition
                if not (placed and answered in (None, places[0][1])):
                    out.append(
                        f"produce {name}: answered 200 with {value!r} at {partition}:{answered}, "
                        f"the log has it at {where.get(value, [])}"
                    )
        # The request's records to one partition keep their order, whatever the answer was.
        last: dict[int, tuple[str, int]] = {}
        for partition, value in call.records:
            found = where.get(value)
            if not found:
                continue
            offset = found[0][1]
            before = last.get(partition)
            if before is not None and before[1] > offset:
                out.append(
                    f"produce {name}: {value!r} at {partition}:{offset} is before "
                    f"{before[0]!r} at {partition}:{before[1]}, sent earlier in the same request"
                )
            last[partition] = (value, offset)


def _check_polls(history: History, log: Log, bounds: Bounds, out: list[str]) -> None:
    by_offset = {p: dict(records) for p, records in log.items()}
    for call in history.polls:
        name = f"{call.partition}@{call.offset}"
        late = _late("long poll", name, call, bounds.poll(call.max_wait_ms), bounds)
        if late:
            out.append(late)
        if call.status != 200:
            continue
        expected_offsets = list(range(call.offset, call.offset + len(call.records)))
        offsets = [offset for offset, _ in call.records]
        if offsets != expected_offsets:
            out.append(f"long poll {name}: offsets {offsets[:5]}... not contiguous from {call.offset}")
        partition_log = by_offset.get(call.partition, {})
        for offset, value in call.records:
            if offset not in partition_log:
                out.append(f"long poll {name}: answered offset {offset} ({value!r}), not in the log")
            elif partition_log[offset] != value:
                out.append(
                    f"long poll {name}: answered {value!r} at offset {offset}, "
                    f"the log has {partition_log[offset]!r}"
                )


def _check_commits(history: History, committed: int | None, bounds: Bounds, out: list[str]) -> None:
    for wait in history.commit_waits:
        name = f"target {wait.target}"
        late = _late("commit wait", name, wait, bounds.commit(wait.timeout_ms), bounds)
        if late:
            out.append(late)
        if wait.status != "committed":
            continue
        answered = wait.answered_s
        assert answered is not None
        if not any(c.offset >= wait.target and c.issued_s <= answered for c in history.commits):
            out.append(
                f"commit wait {name}: answered committed at {answered:.2f} s, before any commit "
                f"reaching it was issued"
            )
        if committed is not None and committed < wait.target:
            out.append(f"commit wait {name}: answered committed, the group's committed offset is {committed}")


def _check_requests(history: History, bounds: Bounds, out: list[str]) -> None:
    for call in history.requests:
        name = call.value.decode(errors="replace")
        late = _late("request", name, call, bounds.request(call.timeout_ms), bounds)
        if late:
            out.append(late)
        if call.status == "reply" and call.reply != b"echo:" + call.value:
            out.append(f"request {name}: answered {call.reply!r}, not its own echo")


def check(history: History, log: Log, committed: int | None, bounds: Bounds) -> CheckResult:
    """The violations of ``history`` against the ``log`` read back (and the group's ``committed``
    offset of the commit waits' partition, ``None`` if it could not be read)."""
    violations: list[str] = []
    _check_produces(history, log, bounds, violations)
    _check_polls(history, log, bounds, violations)
    _check_commits(history, committed, bounds, violations)
    _check_requests(history, bounds, violations)
    counts = {
        "produces": collections.Counter(str(c.status) for c in history.produces),
        "long polls": collections.Counter(str(c.status) for c in history.polls),
        "commit waits": collections.Counter(c.status for c in history.commit_waits),
        "requests": collections.Counter(c.status for c in history.requests),
    }
    return CheckResult(violations, counts)
