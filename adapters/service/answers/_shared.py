"""SharedAnswers: a finished long poll's answer rendered once, for every protocol that writes it.

Why one module: the waiters of one key event get the same 200. Equal long polls share one
operation (:mod:`..app._poll_groups`), so *the operation is the shared thing*: its answer — the
JSON body, the whole HTTP/1.1 response's bytes, the HTTP/2 frames — is rendered once per
operation and kept on it (:class:`SharedAnswer`, in the operation's ``shared_answer`` slot). The
route (ASGI) and both fast paths ask here; nothing else caches answers.

Lifetime (simple on purpose): an answer lives while its operation does — held by its group until
every waiter was answered, and by the connections still writing it — and no longer: no cache of
bodies outlives them, but for one: the last answer rendered (:attr:`SharedAnswers.last`). Equal
polls that arrive in different groups — a consumer catching up, whose poll completes at once
because the records are there, so no later poll can join its group; HTTP/1.1 polls pipelined on
one connection — answer the very same records (the shared record cache hands every read of a
range the same objects): their operation takes the last body when the records (identities, in
order) and every other field of the answer are the same — the very :class:`SharedAnswer`, with
its encodings — instead of rendering it again (up to ~22 MB of JSON for a 16 MiB answer, and
as much again per encoding). One answer, replaced by the next distinct render. An operation
without the slot (scale-out's, a test's) renders each time, past the last answer.

The protocols' encodings are built lazily, each by the protocol (``encode(body, default_headers)``:
this module imports no HTTP/2 code), and kept for uvicorn's current default headers (their
``date`` changes once a second, and uvicorn then makes a new list: compared by identity).

Concurrency contract: the event loop's thread only (answers are rendered and written there).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...kafka import DelayedFetch, FetchedRecord

__all__ = ["SharedAnswer", "SharedAnswers", "fetch_body", "record_json"]

# Bodies past one write (the fast paths' ANSWER_CHUNK) are held while written and released to
# forget(); a few are tracked at once (see SharedAnswers._large).
LARGE_BODY = 64 * 1024
LARGE_TRACKED = 16

_T = TypeVar("_T")
Headers = list[tuple[bytes, bytes]]


def _json_bytes(content: Any) -> bytes:
    """``content`` as Starlette's :class:`JSONResponse` renders it (compact, UTF-8, no NaN)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def record_json(record: FetchedRecord) -> dict[str, Any]:
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
        content["records"] = [record_json(r) for r in records]
    content["error"] = str(op.error) if op.error is not None else None
    return content


# Records rendered per json.dumps call while a body is written (their bytes, before escaping).
RENDER_GROUP_BYTES = 1024 * 1024


def fetch_body(topic: str, partition: int, op: DelayedFetch) -> bytes:
    """The JSON body of a finished one-partition long poll (rendered, not looked up):
    ``_json_bytes(_fetch_json(...))``, the same bytes, rendered a group of records at a time.

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
        group.append(record_json(record))
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

    Reads that reached the record cache's span end (SharedReadReader) make a list of their own of
    the same objects: a walk of identities is far cheaper than rendering their ~18 MB again.
    """
    return len(held) == len(records) and all(a is b for a, b in zip(held, records, strict=True))


class SharedAnswer:
    """One finished operation's answer: its body, and each protocol's encoding of it (lazily)."""

    __slots__ = ("body", "h2", "h2_headers", "h11", "h11_headers")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.h11: Any = None  # HTTP/1.1: the whole response's bytes
        self.h11_headers: Headers | None = None
        self.h2: Any = None  # HTTP/2: the HEADERS + DATA frames without their stream ids
        self.h2_headers: Headers | None = None

    def http11(self, default_headers: Headers, encode: Callable[[bytes, Headers], _T]) -> _T:
        """The HTTP/1.1 bytes ``encode`` makes of the body, for ``default_headers`` (kept)."""
        if self.h11 is None or default_headers is not self.h11_headers:
            self.h11 = encode(self.body, default_headers)
            self.h11_headers = default_headers
        return self.h11  # type: ignore[no-any-return]

    def http2(self, default_headers: Headers, encode: Callable[[bytes, Headers], _T]) -> _T:
        """The HTTP/2 frames ``encode`` makes of the body, for ``default_headers`` (kept)."""
        if self.h2 is None or default_headers is not self.h2_headers:
            self.h2 = encode(self.body, default_headers)
            self.h2_headers = default_headers
        return self.h2  # type: ignore[no-any-return]


class SharedAnswers:
    """Every protocol's way to a finished operation's :class:`SharedAnswer` (module docstring)."""

    def __init__(self) -> None:
        self.rendered = 0  # bodies rendered (tests, and the bench's probes, read them)
        self.hits = 0  # answers found already rendered
        # The last answer rendered and what it answered: (records list, topic, partition, outcome,
        # status, fetch offset, SharedAnswer). Its records stay referenced here, so the list's identity
        # cannot be another list's later.
        self.last: tuple[Any, ...] | None = None
        # Large answers (past one write) by id(body): their operation, which holds them, told to
        # let go on release (forget) — the operation may outlive its last writer (a finished
        # operation is referenced for a while yet: the loop's hand-off, an executor's last item).
        # At most LARGE_TRACKED: a body no holder ever took (sent at once) drops out, oldest first.
        self._large: OrderedDict[int, tuple[Any, SharedAnswer]] = OrderedDict()

    def of(self, topic: str, partition: int, op: DelayedFetch) -> SharedAnswer:
        """``op``'s answer, rendered on its first call and kept on ``op`` (when it has the slot)."""
        answer = getattr(op, "shared_answer", None)
        if answer is not None:
            self.hits += 1
            return answer  # type: ignore[no-any-return]
        answer = self._answer(topic, partition, op)
        if len(answer.body) > LARGE_BODY:
            self._large[id(answer.body)] = (op, answer)
            if len(self._large) > LARGE_TRACKED:
                self._large.popitem(last=False)
        # An operation without the slot (AttributeError): rendered per answer.
        with contextlib.suppress(AttributeError):
            op.shared_answer = answer  # type: ignore[attr-defined]  # OffLoopFetch's slot
        return answer

    def _answer(self, topic: str, partition: int, op: DelayedFetch) -> SharedAnswer:
        (part,) = op.parts
        records = part.records
        last = self.last
        if (
            last is not None
            and (last[0] is records or _same_records(last[0], records))
            and op.error is None
            and last[5] == part.fetch_offset
            and last[3] is op.outcome
            and last[4] is part.status
            and last[2] == partition
            and last[1] == topic
        ):
            self.hits += 1
            return last[6]  # type: ignore[no-any-return]
        answer = SharedAnswer(fetch_body(topic, partition, op))
        self.rendered += 1
        if op.error is None and records:  # an error's text is in its body; nothing to share in ()
            self.last = (records, topic, partition, op.outcome, part.status, part.fetch_offset, answer)
        return answer

    def forget(self, body: object) -> None:
        """Drop the last answer if ``body`` is its body: no connection holds it any more
        (``AnswerBudget.on_release``). Only answers large enough to be held while written (past
        one write) are released so: a large body is shared by the waiters answered with it and
        by its operation while it lives, not kept once written (issue 31: ~18-22 MB held for good
        after the last large answer of a cold service's replay)."""
        last = self.last
        if last is not None and last[6].body is body:
            self.last = None
        tracked = self._large.get(id(body))
        if tracked is not None and tracked[1].body is body:
            del self._large[id(body)]
            op = tracked[0]
            if getattr(op, "shared_answer", None) is tracked[1]:
                op.shared_answer = None  # a later waiter of the operation renders it again

    def body(self, topic: str, partition: int, op: DelayedFetch) -> bytes:
        """``op``'s JSON body (the ASGI route's answer)."""
        return self.of(topic, partition, op).body
