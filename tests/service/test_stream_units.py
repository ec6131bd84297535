"""Event streams without Kafka: the SSE framing, the hub's groups, the per-stream bound.

The hub is driven through a fake of its port (:class:`StreamWaits`): each long poll it asks for
is a future the test answers, so grouping, merging and overflow are pinned without timing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from purgatory.adapters.kafka import FetchedRecord
from purgatory.adapters.service.answers._errors import RequestError
from purgatory.adapters.service.app._stream_route import QueueSink
from purgatory.adapters.service.http._endpoint import CheckedStream
from purgatory.adapters.service.http.h1._sse import SseConnection
from purgatory.adapters.service.stream import (
    StreamHub,
    StreamSink,
    heartbeat_event,
    overflow_event,
    records_event,
    resume_offset,
)
from purgatory.adapters.service.stream import _hub as hub_module
from purgatory.adapters.service.stream._framing import end_event


def _record(offset: int, value: bytes | None = b"v") -> FetchedRecord:
    return FetchedRecord(offset=offset, key=None, value=value, timestamp_ms=1)


def _fields(event: bytes) -> dict[str, str]:
    """An event parsed as EventSource parses it (one event: no blank line inside)."""
    assert event.endswith(b"\n\n") and b"\n\n" not in event[:-2], event
    out: dict[str, str] = {}
    for line in event[:-2].decode().split("\n"):
        if line.startswith(":"):
            out.setdefault("comment", line)
            continue
        name, _, value = line.partition(":")
        out[name] = value.removeprefix(" ")
    return out


# -- framing ---------------------------------------------------------------------------------------


def test_a_records_event_is_one_json_line_whose_id_is_the_next_offset() -> None:
    event = records_event("t", 3, [_record(7, b"line\nbreak"), _record(8, b"\xff")])
    fields = _fields(event)
    assert fields["id"] == "9", "id: the offset to resume from"
    data = json.loads(fields["data"])
    assert data["next_offset"] == 9 and data["partition"] == 3
    assert data["records"][0]["value"] == "line\nbreak", "a line break inside a value stays in the JSON"
    assert data["records"][1]["value_b64"] == "/w==", "not UTF-8: base64, as the long poll"


def test_heartbeat_is_a_comment_and_overflow_and_end_name_where_to_resume() -> None:
    assert _fields(heartbeat_event()) == {"comment": ": heartbeat"}
    overflow = _fields(overflow_event(42, 1024))
    assert overflow["event"] == "overflow" and overflow["id"] == "42"
    assert json.loads(overflow["data"])["next_offset"] == 42
    end = _fields(end_event(RequestError(416, "OFFSET_OUT_OF_RANGE", "offset", "gone", value=5), 5))
    assert end["event"] == "end" and json.loads(end["data"])["error"] == "OFFSET_OUT_OF_RANGE"


@pytest.mark.parametrize(
    ("last_event_id", "query", "expected"),
    [(None, None, None), (None, 4, 4), (b"9", 4, 9), (b" 9 ", None, 9), (b"", 4, 4)],
)
def test_last_event_id_wins_over_the_query_offset(
    last_event_id: bytes | None, query: int | None, expected: int | None
) -> None:
    assert resume_offset(last_event_id, query) == expected


@pytest.mark.parametrize("bad", [b"-1", b"1.0", b"x", b"\xd9\xa3", str(2**63).encode()])
def test_a_last_event_id_that_is_not_an_offset_is_a_400_naming_the_header(bad: bytes) -> None:
    with pytest.raises(RequestError) as refused:
        resume_offset(bad, None)
    assert (refused.value.status, refused.value.field) == (400, "Last-Event-ID")


# -- the hub ---------------------------------------------------------------------------------------


class _Op:
    def __init__(self, offset: int, records: list[FetchedRecord]) -> None:
        part = type("Part", (), {"records": records, "fetch_offset": offset})()
        self.parts = (part,)


class FakeWaits:
    """The hub's port: every poll is a future the test resolves (records, [] = expired, an error)."""

    def __init__(self) -> None:
        self.serving = True
        self.polls: list[tuple[int | None, asyncio.Future[Any]]] = []
        self.end = 0
        self.held = 0

    async def fetch_from(self, topic: str, partition: int, offset: int | None, max_wait_ms: int) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.polls.append((offset, future))
        result = await future
        if isinstance(result, RequestError):
            raise result
        return _Op(offset if offset is not None else self.end, result)

    def known_end(self, topic: str, partition: int) -> int | None:
        return self.end

    def waiters(self) -> int:
        return self.held

    def waiting_at(self) -> list[int | None]:
        return [offset for offset, future in self.polls if not future.done()]

    def answer(self, offset: int, result: Any) -> None:
        (future,) = [f for o, f in self.polls if o == offset and not f.done()]
        future.set_result(result)


class ListSink(StreamSink):
    __slots__ = ("accepts", "events", "finished")

    def __init__(self, accepts: int = 1_000) -> None:
        super().__init__()
        self.events: list[bytes] = []
        self.finished: bytes | None = None
        self.accepts = accepts  # events it takes before it "overflows"

    def send(self, event: bytes, offset: int) -> bool:
        if len(self.events) >= self.accepts:
            self.finished = overflow_event(offset, 0)
            return False
        self.events.append(event)
        return True

    def finish(self, last: bytes) -> None:
        self.finished = last


def _hub(waits: FakeWaits, max_streams: int = 100, per_key: int = 100) -> StreamHub:
    return StreamHub(
        waits, heartbeat_ms=1000, max_streams=max_streams, max_streams_per_key=per_key, retry_after_s=1
    )


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_streams_at_one_offset_share_one_poll_and_one_rendered_event() -> None:
    waits = FakeWaits()
    hub = _hub(waits)
    sinks = [ListSink() for _ in range(3)]
    for sink in sinks:
        hub.join(sink, "t", 0, 5)
    await _settle()
    assert waits.waiting_at() == [5], "one poll for the three streams"
    waits.answer(5, [_record(5), _record(6)])
    await _settle()
    assert all(sink.events == [sinks[0].events[0]] for sink in sinks)
    assert all(sink.events[0] is sinks[0].events[0] for sink in sinks), "rendered once, the same bytes"
    assert waits.waiting_at() == [7], "the group moved on to the next offset"
    assert hub.events == 1


async def test_a_stream_behind_catches_up_and_merges_into_the_group_ahead() -> None:
    waits = FakeWaits()
    hub = _hub(waits)
    ahead, behind = ListSink(), ListSink()
    hub.join(ahead, "t", 0, 7)
    hub.join(behind, "t", 0, 5)
    await _settle()
    assert sorted(waits.waiting_at()) == [5, 7]  # type: ignore[type-var]
    waits.answer(5, [_record(5), _record(6)])
    await _settle()
    assert hub.describe()["t-0"]["positions"] == [7], "merged: one group at 7"
    assert waits.waiting_at() == [7]
    waits.answer(7, [_record(7)])
    await _settle()
    assert ahead.events[-1] is behind.events[-1] and _fields(ahead.events[-1])["id"] == "8"


class StagingSink(ListSink):
    """A sink whose events the hub writes in its shares (``stage``), as the HTTP/1.1 one's are."""

    __slots__ = ()

    def stage(self, event: bytes, offset: int, writes: list[tuple[Any, bytes]]) -> bool:
        writes.append((self, event))
        return True


async def _first_share_written(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeWaits, StreamHub, list[StagingSink], list[int]]:
    """``n`` staging streams at offset 5 of a hub that writes 2 at a time, answered one record:
    returned once the first share is written (the sizes of the shares made go into the list)."""
    monkeypatch.setattr(hub_module, "STAGED_WRITES", 2)
    waits, shares = FakeWaits(), []

    def write_all(writes: list[tuple[Any, bytes]]) -> None:
        shares.append(len(writes))
        for sink, event in writes:
            sink.events.append(event)

    hub = StreamHub(
        waits,
        heartbeat_ms=1000,
        max_streams=100,
        max_streams_per_key=100,
        retry_after_s=1,
        write_all=write_all,
    )
    sinks = [StagingSink() for _ in range(n)]
    for sink in sinks:
        hub.join(sink, "t", 0, 5)
    await _settle()
    waits.answer(5, [_record(5)])
    await _until(lambda: shares)
    return waits, hub, sinks, shares


async def _until(condition: Any) -> None:
    for _ in range(50):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not reached within 50 loop iterations")


async def test_a_groups_event_goes_out_in_shares_with_the_loop_free_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits, _, sinks, shares = await _first_share_written(5, monkeypatch)
    # Another request's callback, queued after the first share: it runs before the last share.
    ran_between: list[int] = []
    asyncio.get_running_loop().call_soon(lambda: ran_between.append(sum(shares)))
    await _until(lambda: sum(shares) == 5)
    assert shares == [2, 2, 1]
    assert ran_between and ran_between[0] < 5, "the loop ran other callbacks between the shares"
    assert all(len(sink.events) == 1 for sink in sinks)
    await _until(lambda: waits.waiting_at() == [6])


async def test_streams_joining_or_leaving_while_an_event_is_written_are_counted_and_none_misses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits, hub, sinks, _ = await _first_share_written(6, monkeypatch)
    unwritten = [sink for sink in sinks if not sink.events]
    assert unwritten, "the first share only: nothing tested"
    leaving, late = unwritten[0], StagingSink()
    hub.leave(leaving)  # its client went: not written, not counted
    hub.join(late, "t", 0, 5)  # joins at the offset being written: must get this event too
    await _until(lambda: waits.waiting_at() == [6])
    assert leaving.events == []
    first = next(sink for sink in sinks if sink.events)
    assert len(late.events) == 1 and late.events[0] is first.events[0]
    assert all(len(sink.events) == 1 for sink in sinks if sink is not leaving)
    assert hub.streams == 6, "5 of the first 6, and the late one"


async def test_an_expired_poll_writes_a_heartbeat_and_polls_again() -> None:
    waits = FakeWaits()
    hub = _hub(waits)
    sink = ListSink()
    hub.join(sink, "t", 0, 3)
    await _settle()
    waits.answer(3, [])
    await _settle()
    assert sink.events == [heartbeat_event()]
    assert waits.waiting_at() == [3]


async def test_a_sink_past_its_bound_leaves_and_the_others_go_on() -> None:
    waits = FakeWaits()
    hub = _hub(waits)
    slow, fast = ListSink(accepts=1), ListSink()
    hub.join(slow, "t", 0, 0)
    hub.join(fast, "t", 0, 0)
    await _settle()
    waits.answer(0, [_record(0)])
    await _settle()
    waits.answer(1, [_record(1)])
    await _settle()
    assert slow.finished is not None and _fields(slow.finished)["id"] == "1", "resume where it stopped"
    assert slow.group is None and hub.streams == 1
    assert len(fast.events) == 2


async def test_an_error_ends_every_stream_of_the_group_with_an_end_event() -> None:
    waits = FakeWaits()
    hub = _hub(waits)
    sink = ListSink()
    hub.join(sink, "t", 0, 9)
    await _settle()
    waits.answer(9, RequestError(416, "OFFSET_OUT_OF_RANGE", "offset", "deleted by retention", value=9))
    await _settle()
    assert sink.finished is not None and _fields(sink.finished)["event"] == "end"
    assert hub.streams == 0 and hub.describe() == {}


async def test_the_last_stream_leaving_cancels_its_groups_poll() -> None:
    waits = FakeWaits()
    hub = _hub(waits)
    sink = ListSink()
    hub.join(sink, "t", 0, 4)
    await _settle()
    ((_, future),) = waits.polls
    hub.leave(sink)
    hub.leave(sink)  # idempotent
    await _settle()
    assert future.cancelled(), "the poll is cancelled (the gateway finishes it CANCELLED)"
    assert hub.streams == 0 and hub.describe() == {}


async def test_join_waiting_takes_an_existing_group_only() -> None:
    waits = FakeWaits()
    hub = _hub(waits)
    first, second, elsewhere = ListSink(), ListSink(), ListSink()
    assert hub.join_waiting(first, "t", 0, None) is None, "no group yet: start() with a poll"
    hub.join(first, "t", 0, 6)
    waits.end = 6
    assert hub.join_waiting(second, "t", 0, None) == 6, "the end, as the feed knows it"
    assert hub.join_waiting(elsewhere, "t", 0, 2) is None
    assert hub.streams == 2


async def test_admission_counts_streams_with_the_purgatories_waiters() -> None:
    waits = FakeWaits()
    hub = _hub(waits, max_streams=3, per_key=2)
    hub.join(ListSink(), "t", 0, 0)
    hub.join(ListSink(), "t", 0, 0)
    with pytest.raises(RequestError) as per_key:
        hub.admit("t", 0)
    assert per_key.value.status == 429 and "max_waiters_per_key" in per_key.value.message
    hub.admit("t", 1)  # another partition: room left
    waits.held = 1
    with pytest.raises(RequestError) as full:
        hub.admit("t", 1)
    assert full.value.headers == {"Retry-After": "1"}
    waits.serving = False
    with pytest.raises(RequestError) as closing:
        hub.admit("t", 1)
    assert closing.value.status == 503
    hub.close()
    assert hub.streams == 0


# -- the sinks' bounds -----------------------------------------------------------------------------


class BufferingTransport:
    """A transport whose client reads nothing: every write stays in its buffer."""

    def __init__(self) -> None:
        self.buffered = 0
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self.buffered += len(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_a_connection_whose_client_reads_nothing_ends_at_its_buffer_with_an_overflow_event() -> None:
    transport = BufferingTransport()
    checked = CheckedStream(hub=None, topic="t", partition=0, offset=0, retry_ms=1, buffer_bytes=1000)  # type: ignore[arg-type]
    connection = SseConnection(transport, checked, endpoint=None, connections=set())  # type: ignore[arg-type]
    event = b"x" * 300
    sent = [connection.send(event, offset) for offset in range(10)]
    assert sent == [True, True, True, False] + [False] * 6, "at most buffer_bytes pending, then the end"
    assert transport.buffered - len(transport.written[-1]) <= 1000
    assert _fields(transport.written[-1])["id"] == "3", "the first event not written: resume there"
    assert transport.closed


def test_a_single_event_larger_than_the_buffer_still_goes_to_an_idle_connection() -> None:
    transport = BufferingTransport()
    checked = CheckedStream(hub=None, topic="t", partition=0, offset=0, retry_ms=1, buffer_bytes=100)  # type: ignore[arg-type]
    connection = SseConnection(transport, checked, endpoint=None, connections=set())  # type: ignore[arg-type]
    assert connection.send(b"y" * 500, 0), "nothing pending: one event of any size (else it never could)"


async def test_the_asgi_queue_is_bounded_the_same_way() -> None:
    sink = QueueSink(buffer_bytes=1000)
    assert [sink.send(b"z" * 400, o) for o in range(4)] == [True, True, False, False]
    received = [event async for event in sink.events()]
    assert len(received) == 3 and _fields(received[-1])["event"] == "overflow"
    assert _fields(received[-1])["id"] == "2"
