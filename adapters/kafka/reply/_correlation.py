"""Request-reply on the wire: the headers a request and its replies carry, and what they decode to.

Why its own module: the requester (:mod:`._reply_router`), the responder (:mod:`._responder`)
and their tests must agree on these bytes, and nothing else here touches Kafka.

The header names are Spring for Apache Kafka's (``ReplyingKafkaTemplate`` / ``@SendTo``), so a
Spring responder answers our requests and our responder answers Spring's::

    request   kafka_correlationId   b"4f0c…"            (the id replies are routed by)
              kafka_replyTopic      b"orders-replies"   (where to answer)
              kafka_replyPartition  4-byte big-endian   (which partition: the requester's own)
              purgatory_deadlineMs  b"1795308354865"     (epoch ms; a responder skips stale requests)
    reply     kafka_correlationId   (copied from the request)
              purgatory_replyFrom   b"pricer"           (the responder's group: N-of-M counts these)
              purgatory_error       b"ValueError: ..."  (the handler raised: an error reply)

A request is a delayed operation watched on its :class:`CorrelationKey`; a reply's correlation id
names the key to complete (docs/design.md §9).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "CORRELATION_ID",
    "DEADLINE_MS",
    "ERROR",
    "REPLY_FROM",
    "REPLY_PARTITION",
    "REPLY_TOPIC",
    "CorrelationKey",
    "Headers",
    "Reply",
    "ReplyAddress",
    "decode_partition",
    "encode_partition",
    "header",
    "headers_of",
]

CORRELATION_ID = "kafka_correlationId"  # Spring's KafkaHeaders.CORRELATION_ID
REPLY_TOPIC = "kafka_replyTopic"  # Spring's KafkaHeaders.REPLY_TOPIC
REPLY_PARTITION = "kafka_replyPartition"  # Spring's KafkaHeaders.REPLY_PARTITION: a 4-byte int
DEADLINE_MS = "purgatory_deadlineMs"
REPLY_FROM = "purgatory_replyFrom"
ERROR = "purgatory_error"

Headers = tuple[tuple[str, bytes | None], ...]
_PARTITION = struct.Struct(">i")  # Spring writes the partition as a big-endian int32


def encode_partition(partition: int) -> bytes:
    return _PARTITION.pack(partition)


def decode_partition(raw: bytes | None) -> int | None:
    """The reply partition a request names, or None (absent or not 4 bytes: any partition)."""
    if raw is None or len(raw) != _PARTITION.size:
        return None
    (partition,) = _PARTITION.unpack(raw)
    return partition if partition >= 0 else None


def headers_of(raw: object) -> Headers:
    """A message's headers as a tuple of ``(name, bytes | None)`` (librdkafka may give str values)."""
    if not raw:
        return ()
    items = raw.items() if isinstance(raw, dict) else raw
    assert isinstance(items, Iterable), f"message headers are pairs, got {type(raw).__name__}"
    return tuple((str(k), v.encode() if isinstance(v, str) else v) for k, v in items)


def header(headers: Iterable[tuple[str, bytes | None]], name: str) -> bytes | None:
    """The last value of header ``name`` (Kafka allows repeats; the last one written wins)."""
    found = None
    for key, value in headers:
        if key == name:
            found = value
    return found


@dataclass(frozen=True, slots=True)
class CorrelationKey:
    """The watch key of one request: its correlation id."""

    correlation_id: str

    @property
    def label(self) -> str:
        return f"correlation:{self.correlation_id}"

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class ReplyAddress:
    """Where a request wants its replies: a topic and, when the requester owns one, a partition."""

    topic: str
    partition: int | None


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply as the requester received it.

    Attributes:
        value, key, headers: the reply record's.
        responder: its ``purgatory_replyFrom`` header (the responder's group), or None.
        error: the ``purgatory_error`` header when the responder's handler raised, else None.
        partition, offset: where the reply was read (reply topic).
    """

    value: bytes | None
    key: bytes | None
    headers: Headers
    responder: str | None
    error: str | None
    partition: int
    offset: int

    @property
    def identity(self) -> str:
        """What makes replies distinct for N-of-M: the responder, or (anonymous) the record itself."""
        return self.responder if self.responder is not None else f"@{self.partition}:{self.offset}"
