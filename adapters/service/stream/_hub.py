"""StreamHub: a partition's new records read once, rendered once, written to every stream at that position.

The algorithm, per partition: streams are grouped by the offset they wait at (their *position*).
Each group has one task that awaits one long poll at its position (the gateway's own
``fetch``: the change feed wakes it, the shared reader reads the records); when it returns records
``[p, q)`` they are rendered once (:func:`._framing.records_event`) and written to every stream of
the group, which then waits at ``q`` — merged into the group already waiting there, if any. A poll
that expires empty writes a heartbeat to the group and polls again (so a heartbeat goes out at
least every ``service.stream_heartbeat_ms`` on an idle stream).

Worked example: 10,000 browsers stream partition 0 from its end, offset 500: one group, one task,
one waiting poll. A produce appends 500..502: one read, one event (``id: 503``) written 10,000
times, the group now waits at 503. A browser reconnects with ``Last-Event-ID: 480``: its own group
at 480 polls, gets 480..502 at once (already there), writes one event to its one stream and, now
at 503, joins the big group. Streams behind catch up with their own reads; streams at the end share
everything.

A slow reader is bounded by its sink (:class:`StreamSink`): a sink that cannot take an event
within ``service.stream_buffer_bytes`` ends its stream with ``event: overflow`` naming the offset
to resume from, and leaves its group: nothing is queued for it here.

Concurrency contract: the event loop's thread only (sinks are written from the groups' tasks).
Admission (:meth:`StreamHub.admit`) counts joined streams against ``admission.max_waiters`` (with
the purgatories' waiters) and ``admission.max_waiters_per_key``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from typing import Any, Protocol

import structlog

from ...kafka import DelayedFetch
from ..answers._errors import RequestError
from ._framing import end_event, heartbeat_event, records_event

__all__ = ["StreamHub", "StreamSink", "StreamWaits"]

_log = structlog.get_logger("purgatory.service")

# A group's staged writes are made this many at a time, the loop free between them: staging
# 10,000 streams before the first write held the first event ~10 ms (and every other one with
# it), and writing them all in one callback held every other request ~100 ms.
STAGED_WRITES = 512


class StreamWaits(Protocol):
    """What the hub asks of the service: one long poll, and how many waiters it holds (the gateway)."""

    @property
    def serving(self) -> bool: ...

    async def fetch_from(
        self, topic: str, partition: int, offset: int | None, max_wait_ms: int
    ) -> DelayedFetch:
        """The gateway's long poll at ``offset`` (None: the end), its refusals as :class:`RequestError`."""
        ...

    def known_end(self, topic: str, partition: int) -> int | None:
        """The partition's high watermark as the change feed knows it now (None: not known)."""
        ...

    def waiters(self) -> int:
        """Operations waiting in the service's purgatories (admission counts them with the streams)."""
        ...


class StreamSink(ABC):
    """One stream's connection as the hub writes it: an event, or the last one.

    ``group`` is the hub's (the group the stream waits in; None when it waits in none).
    """

    __slots__ = ("group",)

    def __init__(self) -> None:
        self.group: _Group | None = None

    @abstractmethod
    def send(self, event: bytes, offset: int) -> bool:
        """Write ``event`` (whose records start at ``offset``); False: the stream ended instead —
        gone, or past its buffer (then it wrote ``event: overflow`` at ``offset`` and closes)."""

    @abstractmethod
    def finish(self, last: bytes) -> None:
        """Write ``last`` and end the stream (the hub lets go of it)."""

    def stage(self, event: bytes, offset: int, writes: list[tuple[Any, bytes]]) -> bool:
        """:meth:`send`, but a sink that writes to a transport may add ``(transport, event)`` to
        ``writes`` instead: the hub makes a group's writes together (``write_all``)."""
        return self.send(event, offset)


class _Group:
    """The streams of one partition waiting at one offset, and the task polling for them."""

    __slots__ = ("offset", "partition", "sinks", "task")

    def __init__(self, partition: _Partition, offset: int) -> None:
        self.partition = partition
        self.offset = offset
        self.sinks: set[StreamSink] = set()
        self.task: asyncio.Task[None] | None = None


class _Partition:
    __slots__ = ("groups", "partition", "streams", "topic")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.groups: dict[int, _Group] = {}
        self.streams = 0


class StreamHub:
    """Every open stream of one service, grouped by partition and position (module docstring)."""

    def __init__(
        self,
        waits: StreamWaits,
        heartbeat_ms: int,
        max_streams: int,
        max_streams_per_key: int,
        retry_after_s: int,
        write_all: Callable[[list[tuple[Any, bytes]]], None] | None = None,
    ) -> None:
        self.waits = waits
        # How a group's staged writes are made (StreamSink.stage): the service shares them among
        # threads (http._fanout_writes); by default each is its transport's write.
        self.write_all = write_all or _write_each
        self.heartbeat_ms = heartbeat_ms
        self.max_streams = max_streams
        self.max_streams_per_key = max_streams_per_key
        self.retry_after_s = retry_after_s
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self.streams = 0  # joined, over all partitions
        self.events = 0  # events rendered (each written to a whole group)

    # -- admission and opening -----------------------------------------------------------------

    def admit(self, topic: str, partition: int) -> None:
        """Raise the refusal a new stream on ``topic``/``partition`` gets now (503, 429), as a long poll's."""
        if not self.waits.serving:
            raise RequestError(503, "SHUTTING_DOWN", None, "the service is shutting down")
        held = self.streams + self.waits.waiters()
        part = self._partitions.get((topic, partition))
        on_key = 0 if part is None else part.streams
        if held >= self.max_streams or on_key >= self.max_streams_per_key:
            limit = "max_waiters" if held >= self.max_streams else "max_waiters_per_key"
            raise RequestError(
                429,
                "PURGATORY_FULL",
                None,
                f"the service holds {held} waiters ({on_key} on {topic}-{partition}): "
                f"admission.{limit} reached",
                headers={"Retry-After": str(self.retry_after_s)},
            )

    async def start(self, topic: str, partition: int, offset: int | None) -> tuple[int, bytes | None]:
        """A new stream's first position and the records already there (one event, or None).

        One long poll that does not wait: the very checks of a long poll (unknown topic or
        partition 404, an offset out of range 416, Kafka unreachable 503) are raised here, before
        the stream's 200; ``offset`` None resolves to the partition's end (new records only).
        """
        op = await self.waits.fetch_from(topic, partition, offset, 0)
        (part,) = op.parts
        records = part.records
        if not records:
            return part.fetch_offset, None
        self.events += 1
        return records[-1].offset + 1, records_event(topic, partition, records)

    def join_waiting(self, sink: StreamSink, topic: str, partition: int, offset: int | None) -> int | None:
        """Join ``sink`` to the group already waiting at ``offset`` (None: at the partition's end, as
        the feed knows it), without :meth:`start`'s poll; the offset joined, or None (no such group:
        :meth:`start` it). The group's own poll vouches for its offset (it waits, so it is in range)."""
        part = self._partitions.get((topic, partition))
        if part is None:
            return None
        if offset is None:
            offset = self.waits.known_end(topic, partition)
        if offset is None or offset not in part.groups:
            return None
        self.join(sink, topic, partition, offset)
        return offset

    def join(self, sink: StreamSink, topic: str, partition: int, offset: int) -> None:
        """``sink`` waits for the records from ``offset`` on, with the streams already there."""
        assert sink.group is None, "a stream waits in one group at a time"
        key = (topic, partition)
        part = self._partitions.get(key)
        if part is None:
            part = self._partitions[key] = _Partition(topic, partition)
        group = part.groups.get(offset)
        if group is None:
            group = part.groups[offset] = _Group(part, offset)
            group.task = asyncio.get_running_loop().create_task(self._poll(group))
        group.sinks.add(sink)
        sink.group = group
        part.streams += 1
        self.streams += 1

    def leave(self, sink: StreamSink) -> None:
        """``sink``'s stream ended (the client left): out of its group; idempotent."""
        group = sink.group
        if group is None:
            return
        self._drop(group, sink)
        if not group.sinks:
            self._end_group(group)

    def close(self) -> None:
        """Shutdown: every stream ends (its client reconnects elsewhere, from its last id)."""
        for part in list(self._partitions.values()):
            for group in list(part.groups.values()):
                for sink in list(group.sinks):
                    self._drop(group, sink)
                    sink.finish(b"")
                self._end_group(group)

    # -- the groups --------------------------------------------------------------------------

    def _drop(self, group: _Group, sink: StreamSink) -> None:
        group.sinks.discard(sink)
        sink.group = None
        group.partition.streams -= 1
        self.streams -= 1

    def _end_group(self, group: _Group) -> None:
        part = group.partition
        if part.groups.get(group.offset) is group:
            del part.groups[group.offset]
        task = group.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # its poll is finished CANCELLED (the gateway's fetch, cancelled)
        if not part.groups:
            self._partitions.pop((part.topic, part.partition), None)

    async def _poll(self, group: _Group) -> None:
        part = group.partition
        while group.sinks:
            try:
                op = await self.waits.fetch_from(part.topic, part.partition, group.offset, self.heartbeat_ms)
            except RequestError as exc:
                self._finish_all(group, end_event(exc, group.offset))
                return
            except Exception:  # a bug: the streams end (their clients resume), the service goes on
                _log.exception("stream_poll_failed", topic=part.topic, partition=part.partition)
                error = RequestError(503, "STREAM_FAILED", None, "the stream failed; resume from its id")
                self._finish_all(group, end_event(error, group.offset))
                return
            records = op.parts[0].records
            if not records:
                await self._write(group, heartbeat_event())
                continue
            self.events += 1
            await self._write(group, records_event(part.topic, part.partition, records))
            self._advance(group, records[-1].offset + 1)

    async def _write(self, group: _Group, event: bytes) -> None:
        """``event`` to every stream of ``group``, :data:`STAGED_WRITES` at a time, the loop free
        between them: other requests (a ``/healthz``, a produce) are not held for the whole group
        (10,000 streams: ~100 ms; a ``/healthz`` sent as they began waited 96-104 ms, now 14-16).
        Meanwhile streams may leave (skipped), and others may join the group at this offset or be
        merged into it: they are written in a further pass, before the group advances, so none
        misses the event."""
        offset = group.offset
        done: set[StreamSink] | None = None  # after a first yield: the streams already handled
        while True:
            # A snapshot: a sink that overflows leaves the set while it is walked.
            if done is None:
                sinks: Collection[StreamSink] = tuple(group.sinks)
            else:
                sinks = group.sinks - done  # joined or merged meanwhile
                done |= sinks
            if not sinks:
                return
            writes: list[tuple[Any, bytes]] = []
            for sink in sinks:
                if sink.group is not group:
                    continue  # left while an earlier share was written
                if not sink.stage(event, offset, writes):
                    self._drop(group, sink)
                elif len(writes) >= STAGED_WRITES:
                    self.write_all(writes)  # the first streams get the event while the rest are staged
                    writes = []
                    if done is None:  # from here on, joiners are told apart by this set
                        done = set(sinks)
                    await asyncio.sleep(0)  # other requests' callbacks, then the next share
            if writes:
                self.write_all(writes)
            if done is None:
                return  # no yield: nobody could join meanwhile

    def _advance(self, group: _Group, offset: int) -> None:
        """The group's streams now wait at ``offset``: with the group there, if one waits already."""
        part = group.partition
        if part.groups.get(group.offset) is group:
            del part.groups[group.offset]
        there = part.groups.get(offset)
        if there is None or not group.sinks:
            group.offset = offset
            if group.sinks:
                part.groups[offset] = group
            else:
                self._end_group(group)
            return
        # Merged: this task ends (the loop sees no sinks), the group there polls for all of them.
        for sink in group.sinks:
            sink.group = there
        there.sinks |= group.sinks
        group.sinks = set()

    def _finish_all(self, group: _Group, last: bytes) -> None:
        for sink in tuple(group.sinks):
            self._drop(group, sink)
            sink.finish(last)
        self._end_group(group)

    def describe(self) -> dict[str, Any]:
        """Streams and groups per partition (for tests and debugging)."""
        return {
            f"{p.topic}-{p.partition}": {
                "streams": p.streams,
                "positions": sorted(p.groups),
                "groups": {
                    o: (len(g.sinks), g.offset, g.task is not None and g.task.done())
                    for o, g in p.groups.items()
                },
            }
            for p in list(self._partitions.values())  # list(): one step, tests read from another thread
        }


def _write_each(writes: list[tuple[Any, bytes]]) -> None:
    for transport, data in writes:
        transport.write(data)
