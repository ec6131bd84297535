"""What a request may ask for: the query of a long poll and the body of a produce, with their limits.

pydantic models, strict about names (``extra="forbid"``: a misspelt parameter is refused, not
ignored) and bounded (a negative wait, a huge ``max_bytes`` or an oversized body is a 4xx naming
the field, never an allocation or a wait without end).
"""

from __future__ import annotations

import re
from typing import Annotated, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from starlette.datastructures import QueryParams

from ...kafka import LEGAL_TOPIC_RULE, ProducerRecord, is_legal_topic
from ..answers._errors import RequestError, from_validation_error
from ._auth import TopicPolicy
from ._metadata import unknown_partition

__all__ = [
    "MAX_FETCH_BYTES",
    "MAX_OFFSET",
    "MAX_PARTITION",
    "MAX_PRODUCE_BODY_BYTES",
    "MAX_PRODUCE_TIMEOUT_MS",
    "MAX_RECORDS_PER_PRODUCE",
    "MAX_WAIT_MS_LIMIT",
    "FetchParams",
    "ProduceRecordIn",
    "ProduceRequest",
    "checked_partition",
    "checked_topic",
    "fetch_params",
    "query_params",
]

# A long poll is held open this long at most: under the 60 s idle timeout of common HTTP proxies
# and load balancers, so the client hears an answer rather than a dropped connection.
MAX_WAIT_MS_LIMIT = 60_000
# A fetch response is read into memory and rendered as JSON: 16x Kafka's 1 MiB per-partition
# default (max.partition.fetch.bytes) is plenty for an HTTP client and bounds memory per request.
MAX_FETCH_BYTES = 16 * 1024 * 1024
DEFAULT_FETCH_BYTES = 1024 * 1024  # Kafka's max.partition.fetch.bytes default
# Produce bodies are buffered before parsing; 4x Kafka's ~1 MiB message.max.bytes default.
MAX_PRODUCE_BODY_BYTES = 4 * 1024 * 1024
MAX_RECORDS_PER_PRODUCE = 10_000  # one request, one DelayedProduce: keep its offsets map small
MAX_PRODUCE_TIMEOUT_MS = 300_000  # 10x Kafka's 30 s request.timeout.ms default
# Kafka's wire types: offsets are int64, partitions int32. Larger numbers are refused here, not
# handed to librdkafka (which would overflow converting them).
MAX_OFFSET = 2**63 - 1
MAX_PARTITION = 2**31 - 1


def _utf8(text: str) -> str:
    # JSON may spell a lone surrogate ("\ud800"): a Python str, but no UTF-8 bytes to send.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"is not valid Unicode text: lone surrogate U+{ord(text[exc.start]):04X} at index {exc.start}"
        ) from None
    return text


# Record text: any JSON string that has a UTF-8 encoding.
Utf8Text = Annotated[str, AfterValidator(_utf8)]


_ASCII_DIGITS = re.compile(r"[0-9]+")


def _ascii_digits(value: object) -> object:
    # A query's numbers arrive as text, and pydantic's lax int reads "+1", " 1", "1_0", "1.0" and
    # "-0" as numbers: a request a proxy or cache sees as one thing would be served as another.
    # Text must be ASCII digits only; Python callers may still give ints (not bools or floats).
    if isinstance(value, str):
        if _ASCII_DIGITS.fullmatch(value) is None:
            raise ValueError("must be written in ASCII digits only (no sign, space, dot or underscore)")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer")
    return value


# An int in a query string: ASCII digits (then bounded by each field's own limits).
QueryInt = Annotated[int, BeforeValidator(_ascii_digits)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_Query = TypeVar("_Query", bound=_Strict)


class FetchParams(_Strict):
    """Query of ``GET /topics/{topic}/partitions/{p}/records`` (names as Kafka's FetchRequest)."""

    offset: QueryInt | None = Field(
        None,
        ge=0,
        le=MAX_OFFSET,
        description="First offset to return; omitted: the high watermark (new records only).",
    )
    max_wait_ms: QueryInt | None = Field(
        None, ge=0, le=MAX_WAIT_MS_LIMIT, description="Longest wait (default: kafka.fetch_max_wait_ms)."
    )
    # max_bytes is declared before min_bytes so that min_bytes' validator can compare with it.
    max_bytes: QueryInt = Field(
        DEFAULT_FETCH_BYTES, gt=0, le=MAX_FETCH_BYTES, description="Response size bound."
    )
    min_bytes: QueryInt | None = Field(
        None, ge=0, le=MAX_FETCH_BYTES, description="Answer once this many bytes arrived (else: records)."
    )
    min_records: QueryInt = Field(
        1, ge=0, le=MAX_RECORDS_PER_PRODUCE, description="Answer once this many arrived."
    )

    @field_validator("min_bytes")
    @classmethod
    def _min_within_max(cls, min_bytes: int | None, info: ValidationInfo) -> int | None:
        max_bytes = info.data.get("max_bytes")
        if min_bytes is not None and max_bytes is not None and min_bytes > max_bytes:
            # The fetch could never be satisfied: it would always wait its whole max_wait_ms.
            raise ValueError(f"min_bytes ({min_bytes}) must not exceed max_bytes ({max_bytes})")
        return min_bytes


class ProduceRecordIn(_Strict):
    """One record of a produce body; key and value are UTF-8 text (``null`` for none).

    Numbers are strict JSON integers: ``true``, ``1.0`` or ``"1"`` as a partition is refused,
    not read as 1.
    """

    value: Utf8Text | None
    key: Utf8Text | None = None
    partition: StrictInt | None = Field(
        None, ge=0, le=MAX_PARTITION, description="Omitted: the producer's partitioner chooses."
    )


class ProduceRequest(_Strict):
    """Body of ``POST /topics/{topic}/records``."""

    records: list[ProduceRecordIn] = Field(min_length=1, max_length=MAX_RECORDS_PER_PRODUCE)
    timeout_ms: StrictInt | None = Field(
        None,
        gt=0,
        le=MAX_PRODUCE_TIMEOUT_MS,
        description="Replication wait (default: kafka.produce_timeout_ms).",
    )


# A partition in the path: ASCII digits only. str.isdigit() also accepts superscript two (U+00B2),
# Arabic-Indic three (U+0663) and fullwidth three (U+FF13); int() fails on the first (a 500 once)
# and reads the others as 3: a request would silently name another partition.
# Without leading zeros: "/partitions/00/" is refused, not read as partition 0 (one spelling per
# partition, as _scaleout's offsets).
_PARTITION = re.compile(r"0|[1-9][0-9]{0,9}")


def _single_known_parameters(query: QueryParams, known: frozenset[str] | None) -> None:
    """A 400 naming a query parameter given twice (``?offset=0&offset=9``: which one was meant?)
    or, when ``known`` is given, one not in it."""
    seen: set[str] = set()
    for name, _ in query.multi_items():
        if known is not None and name not in known:
            raise RequestError(
                400, "INVALID_REQUEST", name, f"unknown query parameter {name!r}; expected {sorted(known)}"
            )
        if name in seen:
            raise RequestError(400, "INVALID_REQUEST", name, f"query parameter {name!r} is given twice")
        seen.add(name)


def checked_topic(topic: str, policy: TopicPolicy) -> str:
    """``topic`` from a request path if it is a legal Kafka name the policy allows, else a 400/403."""
    # The keys' rule ("%2e%2e" in a path arrives here as "..", "%0A" as a newline).
    if not is_legal_topic(topic):
        raise RequestError(
            400, "INVALID_TOPIC_EXCEPTION", "topic",
            f"topic {topic!r} is not a legal Kafka topic name ({LEGAL_TOPIC_RULE})",
        )  # fmt: skip
    policy.check(topic)
    return topic


def checked_partition(raw: str) -> int:
    """A partition from a request path (ASCII digits, an int32), else a 400 naming it."""
    if not _PARTITION.fullmatch(raw) or int(raw) > MAX_PARTITION:
        raise RequestError(
            400, "INVALID_REQUEST", "partition",
            f"partition must be an int in [0, {MAX_PARTITION}] written in ASCII digits without "
            f"leading zeros, got {raw!r}",
        )  # fmt: skip
    return int(raw)


def query_params(model: type[_Query], query: QueryParams) -> _Query:
    """A route's query as its ``model``, else a 400 naming the first bad field (or a repeated one)."""
    if len(query) != len(query.multi_items()):
        _single_known_parameters(query, None)
    try:
        return model.model_validate(dict(query))
    except ValidationError as exc:
        raise from_validation_error(exc, where="query") from None


def fetch_params(query: QueryParams) -> FetchParams:
    """The long poll's query as :class:`FetchParams`, else a 400 naming the first bad field."""
    return query_params(FetchParams, query)


def producer_records(
    topic: str, request: ProduceRequest, count: int, message_max_bytes: int
) -> list[ProducerRecord]:
    """The request's records to produce to ``topic`` (``count`` partitions), each checked first:
    a record over the producer's ``message.max.bytes`` is a 413 and a partition the topic does not
    have a 404, both naming the record, before any is appended (a request is refused whole)."""
    records = []
    for i, record in enumerate(request.records):
        # Encoded once: the size check and the record share the bytes.
        value = None if record.value is None else record.value.encode()
        key = None if record.key is None else record.key.encode()
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        if size > message_max_bytes:
            larger = "key" if key is not None and (value is None or len(key) > len(value)) else "value"
            raise RequestError(
                413,
                "MESSAGE_TOO_LARGE",
                f"records[{i}].{larger}",
                f"record {i} has {size} bytes of key and value, more than the producer's "
                f"message.max.bytes ({message_max_bytes}); nothing was appended",
            )
        if record.partition is not None and record.partition >= count:
            raise unknown_partition(topic, count, record.partition, f"records[{i}].partition")
        records.append(ProducerRecord(topic, value, key, record.partition))
    return records
