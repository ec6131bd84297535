"""RenderedFetches: a finished long poll's answer rendered once, shared by every protocol.

The ASGI route and both fast paths (HTTP/1.1, HTTP/2) answer a finished long poll with the body
rendered here (:meth:`RenderedFetches.body`), so the answers of one key event are one ``bytes``
object; ``fetch_response`` and ``error_response`` are the responses built around a body or a
refusal, for any HTTP framework path.
"""

from __future__ import annotations

import base64
import io
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from starlette.responses import JSONResponse, Response

from ...kafka import DelayedFetch, FetchedRecord
from ._errors import RequestError

__all__ = ["RenderedFetches", "error_response", "fetch_body_response", "fetch_response"]

# Distinct long-poll answers kept rendered: one per (partition, offset, records) being answered at
# once is what is shared; a few hundred covers many hot partitions at a few KB each.
RENDERED_FETCHES = 256

# ... and their bytes in all: a rendered body (and the records it keeps alive) is about the size
# of its records, up to max_bytes each; 64 MiB is the shared record cache's own bound.
RENDERED_FETCH_BYTES = 64 * 1024 * 1024


def fetch_response(rendered: RenderedFetches, topic: str, partition: int, op: DelayedFetch) -> Response:
    """The 200 answer of a finished long poll (the body shared by every waiter answered the same)."""
    return fetch_body_response(rendered.body(topic, partition, op))


def fetch_body_response(body: bytes) -> Response:
    """The 200 answer whose body :meth:`RenderedFetches.body` rendered."""
    return Response(body, media_type="application/json")


def error_response(exc: RequestError) -> Response:
    """A refused request's answer: the error's JSON body, status and headers (Retry-After of a 429)."""
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _json_bytes(content: Any) -> bytes:
    """``content`` as :class:`JSONResponse` renders it (compact, UTF-8, no NaN)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _record_json(record: FetchedRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"offset": record.offset, "timestamp_ms": record.timestamp_ms}
    for name, data in (("key", record.key), ("value", record.value)):
        if data is None:
            out[name] = None
            continue
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:  # binary payloads survive the trip as base64
            out[f"{name}_b64"] = base64.b64encode(data).decode("ascii")
    return out


def _fetch_json(topic: str, partition: int, op: DelayedFetch, *, with_records: bool = True) -> dict[str, Any]:
    """The answer's JSON content (without the ``records`` field when ``with_records`` is False)."""
    (part,) = op.parts
    records = part.records
    content: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "outcome": op.outcome.name if op.outcome is not None else None,
        "error_code": part.status.value,
        "fetch_offset": part.fetch_offset,
        "next_offset": records[-1].offset + 1 if records else part.fetch_offset,
    }
    if with_records:
        content["records"] = [_record_json(r) for r in records]
    content["error"] = str(op.error) if op.error is not None else None
    return content


# Records rendered per json.dumps call while a body is written (their bytes, before escaping).
RENDER_GROUP_BYTES = 1024 * 1024


def _fetch_body(topic: str, partition: int, op: DelayedFetch) -> bytes:
    """``_json_bytes(_fetch_json(...))``, the same bytes, rendered a group of records at a time.

    Why: the whole answer as one ``json.dumps`` is its records as strings, the encoder's chunks,
    their joined text and the UTF-8 bytes, all alive at once — 40 MB of Python allocations for
    issue 31's ~18 MB body of 4 MB of records (tracemalloc), and the service's RSS peaked past
    the issue's 50 MB for one answer. Here the fields around the records are rendered alone, and
    the records in groups of about RENDER_GROUP_BYTES written into one buffer whose bytes become
    the body without a copy (``BytesIO.getvalue``): the body plus one group at a time.
    """
    fields = _fetch_json(topic, partition, op, with_records=False)
    error = fields.pop("error")
    out = io.BytesIO()
    out.write(_json_bytes(fields)[:-1])  # without its closing brace: the records follow
    out.write(b',"records":[')
    group: list[dict[str, Any]] = []
    group_bytes = 0
    first = True
    for record in op.parts[0].records:
        group.append(_record_json(record))
        group_bytes += record.size
        if group_bytes >= RENDER_GROUP_BYTES:
            first = _write_group(out, group, first)
            group, group_bytes = [], 0
    if group:
        _write_group(out, group, first)
    out.write(b"],")
    out.write(_json_bytes({"error": error})[1:])  # the last field and the closing brace
    return out.getvalue()


def _write_group(out: io.BytesIO, group: list[dict[str, Any]], first: bool) -> bool:
    """Write ``group``'s records as elements of the answer's list (a comma before all but the first)."""
    if not first:
        out.write(b",")
    out.write(_json_bytes(group)[1:-1])  # the list's elements, without its brackets
    return False


def _same_records(held: Sequence[FetchedRecord], records: Sequence[FetchedRecord]) -> bool:
    """Whether two lists hold the very same record objects, in order.

    The polls of one key event usually share one list; but reads that reached the span's end
    (SharedReadReader) make a list of their own of the same objects, and a body too large for
    the LRU was then rendered again per list — a 4 MB answer renders to ~18 MB of JSON, and 100
    such polls held several distinct copies of it. A walk of identities is far cheaper than that.
    """
    return len(held) == len(records) and all(a is b for a, b in zip(held, records, strict=True))


class RenderedFetches:
    """Long-poll answers rendered once and shared by every waiter answered the same.

    A record appended to a partition completes every long poll waiting at its end with the same
    answer: rendering each (JSON of the records, then the response) cost ~100-170 µs per waiter,
    so the last of 10,000 waiters heard of the record seconds after it was produced. The body is
    a function of the answer's fields and the records' *identity* (the shared record cache hands
    every waiter the same :class:`FetchedRecord` objects), so the key holds their ids; the entry
    holds the records themselves, so no id is reused while its entry lives. A waiter answered
    with other records (another offset, fewer bytes) renders its own and keys its own entry.

    Concurrency contract: the event loop's thread only (responses are built there). At most
    ``max_entries`` bodies of at most ``max_bytes`` in all are kept (a body holds its records
    too), least recently used dropped first; a body larger than a quarter of that is not kept.
    """

    def __init__(self, max_entries: int = RENDERED_FETCHES, max_bytes: int = RENDERED_FETCH_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Any, ...], tuple[Sequence[FetchedRecord], bytes]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        # The last body with what it answered: (topic, partition, outcome, status, fetch offset,
        # the records' list itself, body). The waiters of one key event hold the very same list
        # (SharedReadReader's last answer, shared), so most answers of a burst are this entry,
        # found by a few identity checks instead of a key of seven fields and an LRU move. Its
        # records stay referenced here, so the identity cannot be another list's later.
        self._last: tuple[str, int, Any, Any, int, Sequence[FetchedRecord], bytes] | None = None

    def body(self, topic: str, partition: int, op: DelayedFetch) -> bytes:
        (part,) = op.parts
        records = part.records
        last = self._last
        if (
            last is not None
            and (last[5] is records or _same_records(last[5], records))
            and op.error is None
            and last[4] == part.fetch_offset
            and last[2] is op.outcome
            and last[3] is part.status
            and last[1] == partition
            and last[0] == topic
        ):
            self.hits += 1
            return last[6]
        body = self._body(topic, partition, op, records)
        if op.error is None:
            # Kept whatever its size (the LRU keeps none past a quarter of its bytes): one body,
            # at most a 16 MiB answer's ~22 MB of JSON, and the waiters of a key event answered
            # with the largest answers share it instead of rendering ~22 MB each (the
            # memory-runaway report: 1,000 min_bytes=16000000 polls).
            self._last = (topic, partition, op.outcome, part.status, part.fetch_offset, records, body)
        return body

    def forget(self, body: object) -> None:
        """Drop ``body`` wherever it is kept: no connection holds it any more (AnswerBudget.on_release).

        Only answers large enough to be held while written (past one write) are released so: a
        large body is shared by the waiters answered with it, not kept once written. The next
        answer alike renders it again — a cost paid per burst of large answers, where keeping it
        held ~18-22 MB for good after the last large answer (issue 31, a cold service's replay).
        """
        last = self._last
        if last is not None and last[6] is body:
            self._last = None
        for cache_key in [key for key, (_, kept) in self._entries.items() if kept is body]:
            _, dropped = self._entries.pop(cache_key)
            self._bytes -= len(dropped)

    def _body(self, topic: str, partition: int, op: DelayedFetch, records: Sequence[FetchedRecord]) -> bytes:
        part = op.parts[0]
        cache_key = (
            topic,
            partition,
            op.outcome,
            part.status,
            part.fetch_offset,
            str(op.error) if op.error is not None else None,
            tuple(map(id, records)),
        )
        entry = self._entries.get(cache_key)
        if entry is not None:
            self._entries.move_to_end(cache_key)
            self.hits += 1
            return entry[1]
        body = _fetch_body(topic, partition, op)
        if len(body) <= self.max_bytes // 4:
            self._entries[cache_key] = (records, body)
            self._bytes += len(body)
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)
        return body
