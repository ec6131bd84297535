"""The bytes of a stream (the ``text/event-stream`` format, WHATWG HTML §9.2), rendered once per event.

An event carries one batch of records (what one read of the partition returned) as one JSON line::

    id: 42
    data: {"topic":"t","partition":0,"next_offset":42,"records":[{"offset":40,...},{"offset":41,...}]}

``id`` is the *next* offset: what a client resumes from. A browser's ``EventSource`` sends it back
as ``Last-Event-ID`` when it reconnects, so a dropped connection resumes without loss or
duplicates. Other events: a heartbeat (a comment line, ignored by ``EventSource``, that keeps
proxies from closing an idle stream), ``event: overflow`` (the reader was too slow; its ``id`` and
``next_offset`` say where to resume) and ``event: end`` (the stream ended with an error answer, the
long poll's JSON).

The JSON of a record is the long poll's (:mod:`..answers._render`): a key or value that is not
UTF-8 is ``key_b64`` / ``value_b64``. JSON text never holds a raw line break (``json.dumps``
escapes them), so one ``data:`` line carries the whole event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...kafka import FetchedRecord
from ..answers._errors import RequestError
from ..answers._shared import record_json

__all__ = [
    "LAST_EVENT_ID",
    "end_event",
    "heartbeat_event",
    "overflow_event",
    "records_event",
    "resume_offset",
    "retry_field",
]

# The request header an EventSource sends when it reconnects (lowercased, as the protocols see it).
LAST_EVENT_ID = b"last-event-id"
# Kafka's offsets are int64 (as _requests.MAX_OFFSET).
_MAX_OFFSET = 2**63 - 1


def _json(content: Any) -> bytes:
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def records_event(topic: str, partition: int, records: Sequence[FetchedRecord]) -> bytes:
    """One event for a batch of records (non-empty, in offset order); its id is the next offset."""
    assert records, "an event carries at least one record"
    next_offset = records[-1].offset + 1
    data = {
        "topic": topic,
        "partition": partition,
        "next_offset": next_offset,
        "records": [record_json(r) for r in records],
    }
    return b"id: %d\ndata: %s\n\n" % (next_offset, _json(data))


def heartbeat_event() -> bytes:
    """A comment line: traffic on an idle stream, ignored by every SSE client."""
    return b": heartbeat\n\n"


def retry_field(retry_ms: int) -> bytes:
    """The reconnection delay an ``EventSource`` waits after a dropped connection."""
    return b"retry: %d\n\n" % retry_ms


def overflow_event(next_offset: int, buffer_bytes: int) -> bytes:
    """The last event of a stream whose reader fell more than ``buffer_bytes`` behind."""
    data = {
        "next_offset": next_offset,
        "reason": f"the reader fell more than {buffer_bytes} bytes behind; resume from next_offset",
    }
    return b"id: %d\nevent: overflow\ndata: %s\n\n" % (next_offset, _json(data))


def end_event(error: RequestError, next_offset: int | None) -> bytes:
    """The last event of a stream ended by an error (the long poll's JSON error body)."""
    body: Mapping[str, Any] = error.body()
    if next_offset is None:
        return b"event: end\ndata: %s\n\n" % _json(body)
    return b"id: %d\nevent: end\ndata: %s\n\n" % (next_offset, _json({**body, "next_offset": next_offset}))


def resume_offset(last_event_id: bytes | str | None, query_offset: int | None) -> int | None:
    """Where a stream starts: ``Last-Event-ID`` (a reconnection) before ``?offset=``; None: the end.

    An ``EventSource`` reconnects to the very URL it opened, ``?offset=`` included, and adds the
    id of the last event it received: that one is the newer position. An id that is not an offset
    (ASCII digits, an int64) is a 400 naming the header, not a silent restart elsewhere.
    """
    if last_event_id is None:
        return query_offset
    text = last_event_id.decode("latin-1") if isinstance(last_event_id, bytes) else last_event_id
    text = text.strip()
    if text == "":  # EventSource sends an empty id once an event reset it: no position
        return query_offset
    if not (text.isascii() and text.isdigit()) or int(text) > _MAX_OFFSET:
        raise RequestError(
            400,
            "INVALID_REQUEST",
            "Last-Event-ID",
            f"Last-Event-ID must be an offset (ASCII digits, at most {_MAX_OFFSET}), got {text[:40]!r}",
            value=text[:40],
        )
    return int(text)
