"""TopicMetadata: what the gateway asks of Kafka about topics and offsets before anything waits.

A topic's partition count (cached ``METADATA_MAX_AGE_S``; one DescribeTopics per topic however
many requests arrive while it is in flight), a partition's high watermark (the change feed's when
it follows the key, else one shared ListOffsets) and whether an offset lies in
``[log start, high watermark]`` (the feed's facts when they vouch for it, else both ends asked at
once). Every Kafka call runs on the gateway's bounded metadata pool with its deadline; Kafka's
errors become the client's answers (:func:`kafka_error`), never a 500.

Concurrency contract: the event loop's thread (one gateway per loop); the pool's threads only
run the view's calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ...kafka import (
    ChangeFeed,
    ClusterView,
    InvalidTopicError,
    KafkaAdapterError,
    KafkaCalls,
    KafkaUnavailableError,
    RecordTooLargeError,
    TopicKey,
    TopicPartitionKey,
    UnknownTopicError,
)
from ..answers._errors import RequestError

__all__ = ["METADATA_MAX_AGE_S", "TopicMetadata", "kafka_error", "unknown_partition", "unreachable_offset"]

# Topic metadata (partition count) is cached this long: new partitions appear within it, and a
# burst of requests on one topic costs one DescribeTopics. Unknown topics are never cached (the
# topic may be created a moment later).
METADATA_MAX_AGE_S = 5.0


@dataclass(frozen=True, slots=True)
class _TopicMeta:
    partitions: int
    fetched_at: float


class TopicMetadata:
    """Partition counts, high watermarks and offset ranges for the gateway (module docstring)."""

    def __init__(self, view: ClusterView, feed: ChangeFeed, calls: KafkaCalls, timeout_s: float) -> None:
        self.view = view
        self.feed = feed
        self.calls = calls
        self.timeout_s = timeout_s  # one metadata call's deadline: the view's request timeout + margin
        self._topics: dict[str, _TopicMeta] = {}
        # Calls in flight by what they ask: concurrent requests for one topic or partition share one.
        self._in_flight: dict[Hashable, asyncio.Future[Any]] = {}

    def _shared_call(
        self, name: Hashable, call: Callable[[list[Any]], Any], arg: Any, what: str
    ) -> Awaitable[Any]:
        """``call([arg])`` on the metadata pool, one in flight per ``name`` however many await it
        (shielded: one caller giving up does not cancel the others' answer)."""
        pending = self._in_flight.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self.calls.run(call, [arg], timeout_s=self.timeout_s, what=what))
            self._in_flight[name] = pending
            pending.add_done_callback(lambda _: self._in_flight.pop(name, None))
        return asyncio.shield(pending)

    async def partitions(self, topic: str) -> int:
        """The topic's partition count (cached); a 404 :class:`RequestError` if it does not exist."""
        cached = self.cached_partitions(topic)
        if cached is not None:
            return cached
        now = time.monotonic()
        key = TopicKey(topic)
        try:
            facts = await self._shared_call(key, self.view.topics, key, f"DescribeTopics({topic!r})")
        except UnknownTopicError:
            self._topics.pop(topic, None)
            raise RequestError(
                404, "UNKNOWN_TOPIC_OR_PARTITION", "topic", f"topic {topic!r} does not exist", value=topic
            ) from None
        except KafkaAdapterError as exc:
            raise kafka_error(exc, topic) from None
        count = len(facts[key].leaders)
        self._topics[topic] = _TopicMeta(count, now)
        return count

    def known_partitions(self, topic: str) -> int | None:
        """The last partition count read for ``topic``, fresh or not (partitions are never taken
        away: a count covers its partitions for good), else None."""
        meta = self._topics.get(topic)
        return None if meta is None else meta.partitions

    def forget(self, topic: str) -> None:
        """Drop ``topic``'s cached count (an operation found one of its partitions gone)."""
        self._topics.pop(topic, None)

    def cached_partitions(self, topic: str) -> int | None:
        """The topic's partition count if cached and fresh (no Kafka call), else None."""
        meta = self._topics.get(topic)
        if meta is not None and time.monotonic() - meta.fetched_at < METADATA_MAX_AGE_S:
            return meta.partitions
        return None

    async def check_partition(self, topic: str, partition: int, field: str) -> None:
        count = await self.partitions(topic)
        if partition >= count:
            raise unknown_partition(topic, count, partition, field)

    async def high_watermark(self, key: TopicPartitionKey) -> int:
        """The partition's high watermark: the feed's when it follows the key, else one ListOffsets.

        A watched partition's high watermark is in the feed's snapshot (pushed by its tail, or
        polled): reading it costs nothing, where a ListOffsets per request cost an executor hop
        and a round trip per waiter. Concurrent requests for an unwatched key share one request.
        """
        known = self.known_high_watermark(key)
        if known is not None:
            return known
        try:
            highs = await self._shared_call(key, self.view.high_watermarks, key, f"ListOffsets({key.label})")
            return int(highs[key])
        except KafkaAdapterError as exc:
            raise kafka_error(exc, key.topic) from None

    def known_high_watermark(self, key: TopicPartitionKey) -> int | None:
        """The feed's high watermark of ``key`` while it follows the key and Kafka is reachable."""
        facts = self.feed.partition(key)
        if facts is None or facts.error is not None or self.feed.unavailable is not None:
            return None
        return facts.high_watermark

    async def check_offset_in_range(self, key: TopicPartitionKey, offset: int, timeout_s: float) -> None:
        """416 unless ``offset`` lies in the partition's ``[log start, high watermark]``.

        A fetch that expired before the change feed first reported its partition (``max_wait_ms``
        0 or 1) never had its offset checked: it would answer EXPIRED with no error however far
        past the end the offset was, while a longer wait answers 416. Kafka validates the fetch
        offset before a fetch waits at all; here the check costs a round trip only when the feed
        cannot vouch for the offset (an expired poll at the end of the log does not pay it).
        """
        if self.offset_vouched(key, offset):
            return
        what = f"ListOffsets({key.label})"
        # Both ends at once, under one deadline: asked one after the other, each with its own
        # deadline, a slow broker made the answer wait twice (the chaos suite saw a 0.24 s poll
        # answered after 5.3 s, past its documented bound).
        calls = asyncio.gather(
            self.calls.run(self.view.high_watermarks, [key], timeout_s=timeout_s, what=what),
            self.calls.run(self.view.log_start_offsets, [key], timeout_s=timeout_s, what=what),
        )
        try:
            highs, starts = await calls
        except KafkaAdapterError as exc:
            raise kafka_error(exc, key.topic) from None
        high, start = highs[key], starts[key]
        if not start <= offset <= high:
            raise RequestError(
                416,
                "OFFSET_OUT_OF_RANGE",
                "offset",
                f"fetch offset {offset} of {key.label} is out of range "
                f"[log start {start}, high watermark {high}]",
                value=offset,
            )

    def offset_vouched(self, key: TopicPartitionKey, offset: int) -> bool:
        """True when the feed's facts put ``offset`` in ``[log start, high watermark]`` of ``key``."""
        facts = self.feed.partition(key)
        if facts is None:
            return False
        start, high = facts.log_start_offset, facts.high_watermark
        return start is not None and high is not None and start <= offset <= high


def kafka_error(exc: KafkaAdapterError, topic: str) -> RequestError:
    """A Kafka error as the client's answer: its own mistake a 4xx naming the field, else 503.

    Never a 500: whatever Kafka answered, the service itself is working.
    """
    if isinstance(exc, UnknownTopicError):
        return RequestError(404, "UNKNOWN_TOPIC_OR_PARTITION", "topic", str(exc), value=topic)
    if isinstance(exc, InvalidTopicError):
        return RequestError(400, "INVALID_TOPIC_EXCEPTION", "topic", str(exc), value=topic)
    if isinstance(exc, RecordTooLargeError):
        # Larger than the topic's max.message.bytes (the producer's own limit is checked first).
        return RequestError(413, "MESSAGE_TOO_LARGE", "records", str(exc))
    if isinstance(exc, KafkaUnavailableError):
        return RequestError(503, "KAFKA_UNAVAILABLE", None, str(exc))
    return RequestError(503, "KAFKA_ERROR", None, f"Kafka refused the request: {exc}")


def unknown_partition(topic: str, count: int, partition: int, field: str) -> RequestError:
    """The 404 of a partition the topic does not have, naming the request's ``field``."""
    return RequestError(
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
        field,
        f"topic {topic!r} has {count} partition(s): partition {partition} does not exist",
        value=partition,
    )


# GET /replicated waits for offsets past the high watermark by design: appended (acks=1) and not
# yet on every in-sync replica. How far the log end is past the high watermark no client can ask
# (ListOffsets answers the high watermark), so an offset is "past the log end" when no partition
# could have appended it nor append it before the wait ends: the fastest partitions append ~1-2M
# small records/s, 10x that is the rate bound, over the longest a lagging follower stays in sync
# (replica.lag.time.max.ms, Kafka's default 30 s) plus the wait itself. Past that: 416 at once,
# as a fetch past the high watermark, instead of a waiter held for its whole timeout.
MAX_PARTITION_APPEND_RATE = 10_000_000  # records per second
REPLICA_LAG_MAX_S = 30


def unreachable_offset(offset: int, high_watermark: int, wait_ms: int) -> bool:
    """True when ``offset`` lies further past ``high_watermark`` than any partition could have
    appended, or append within ``wait_ms`` (see MAX_PARTITION_APPEND_RATE)."""
    reach = MAX_PARTITION_APPEND_RATE * (REPLICA_LAG_MAX_S * 1000 + wait_ms) // 1000
    return offset - high_watermark > reach
