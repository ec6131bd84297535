"""Journal events: one operation's lifecycle, as flat JSON lines.

Every operation handed to a journaled purgatory yields exactly two events (when it finishes):

* ``created`` — type, purgatory, watch keys, timeout; written when the operation is submitted.
* ``completed`` / ``expired`` / ``cancelled`` — its outcome, with ``latency_ms`` measured on the
  monotonic clock from submission to finish, and ``error_code`` when the operation says what its
  caller was answered (:class:`AnsweredOperation`: the Kafka operations do): ``"NONE"`` for
  success, else the first error status (``"UNKNOWN_TOPIC_OR_PARTITION"``, ``"REQUEST_TIMED_OUT"``,
  ...). A ``completed`` event with an error code other than ``NONE`` is an operation that
  finished early because of an error: *completed with error*, which the analytics count apart.

``event_id`` is ``<op_id>:<event_type>``: deterministic, so a retried or re-sent event carries the
same id and the consumer (the Spark job) removes the duplicate. ``op_id`` is unique per submission
(see :class:`~purgatory.journal.Journal`). ``ts_ms`` is the wall-clock time of the event in epoch
milliseconds: the event time the analytics window on.

A line looks like::

    {"event_id":"7f3a…-1:created","event_type":"created","op_id":"7f3a…-1","op_type":"DelayedFetch",
     "purgatory":"Fetch","ts_ms":1795308354865,"keys":["orders-0"],"timeout_ms":500}
    {"event_id":"7f3a…-1:completed","event_type":"completed","op_id":"7f3a…-1","op_type":"DelayedFetch",
     "purgatory":"Fetch","ts_ms":1795308354871,"latency_ms":6.2,"error_code":"NONE"}
"""

from __future__ import annotations

import enum
import json
import json.encoder
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .._errors import PurgatoryError
from .._outcome import Outcome

__all__ = ["AnsweredOperation", "EventType", "JournalEvent", "JournalFormatError", "event_type_for"]


class JournalFormatError(PurgatoryError, ValueError):
    """A journal line could not be read: the message names the field, the value and why."""


class EventType(enum.Enum):
    CREATED = "created"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


_FINISH_TYPES = {
    Outcome.COMPLETED: EventType.COMPLETED,
    Outcome.EXPIRED: EventType.EXPIRED,
    Outcome.CANCELLED: EventType.CANCELLED,
}


def event_type_for(outcome: Outcome) -> EventType:
    """The finish event written for an operation that finished with ``outcome``."""
    return _FINISH_TYPES[outcome]


@runtime_checkable
class AnsweredOperation(Protocol):
    """What an operation may tell the journal about the answer its caller got (optional).

    ``requested_ns``: ``time.monotonic_ns()`` when the caller asked (0: unknown), which may be
    before the purgatory was handed the operation (a check, a send): the journal's latency then
    runs from it, so it is what the caller waited, not only the purgatory's part.
    ``answer_code()``: the answer in one code, ``"NONE"`` for success (Kafka's error names).

    Both are read on the journal's writer thread, after the finish: they must be final then (an
    operation that defines them is not submitted again).
    """

    requested_ns: int

    def answer_code(self) -> str: ...


# The C string escaper behind json.dumps (non-ASCII kept as is, like ensure_ascii=False).
_quote: Callable[[str], str] = json.encoder.encode_basestring


class JournalEvent(NamedTuple):
    """One lifecycle event. ``keys``/``timeout_ms`` only on ``created``; ``latency_ms`` and
    ``error_code`` (None: the operation does not say, the key is then left out) only on finishes.

    A NamedTuple: immutable, and ~4x cheaper to build than a frozen dataclass — the journal's
    writer builds one per operation event, sharing the GIL with the purgatory's threads.
    """

    event_id: str
    event_type: EventType
    op_id: str
    op_type: str
    purgatory: str
    ts_ms: int
    keys: tuple[str, ...] = ()
    timeout_ms: int | None = None
    latency_ms: float | None = None
    error_code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "event_id": self.event_id,
            "event_type": self.event_type.value,
            "op_id": self.op_id,
            "op_type": self.op_type,
            "purgatory": self.purgatory,
            "ts_ms": self.ts_ms,
        }
        # Absent rather than null: finish events are most of the journal, keep them short.
        if self.event_type is EventType.CREATED:
            record["keys"] = list(self.keys)
            record["timeout_ms"] = self.timeout_ms
        else:
            record["latency_ms"] = self.latency_ms
            if self.error_code is not None:
                record["error_code"] = self.error_code
        return record

    def to_json(self) -> str:
        """One compact JSON line, without the newline; the same text as ``json.dumps(to_dict())``
        with compact separators.

        Formatted directly (strings escaped by json's C escaper) rather than through a dict and
        ``json.dumps``: about 3x cheaper, and the writer thread does this for every event.
        """
        head = (
            f'{{"event_id":{_quote(self.event_id)},"event_type":"{self.event_type.value}",'
            f'"op_id":{_quote(self.op_id)},"op_type":{_quote(self.op_type)},'
            f'"purgatory":{_quote(self.purgatory)},"ts_ms":{self.ts_ms:d}'
        )
        if self.event_type is EventType.CREATED:
            keys = ",".join([_quote(key) for key in self.keys])
            timeout = "null" if self.timeout_ms is None else f"{self.timeout_ms:d}"
            return f'{head},"keys":[{keys}],"timeout_ms":{timeout}}}'
        latency = "null" if self.latency_ms is None else repr(float(self.latency_ms))
        if self.error_code is None:
            return f'{head},"latency_ms":{latency}}}'
        return f'{head},"latency_ms":{latency},"error_code":{_quote(self.error_code)}}}'

    @classmethod
    def from_json(cls, line: str | bytes) -> JournalEvent:
        """Parse one line; raises :class:`JournalFormatError` naming what is wrong."""
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise JournalFormatError(f"journal line is not JSON ({exc}): {line[:200]!r}") from None
        except RecursionError:
            # json.loads recurses per nesting level: a hostile '[[[[…' line must be a bad line, not a crash.
            raise JournalFormatError(
                f"journal line is nested too deeply to be an event: {line[:200]!r}"
            ) from None
        if not isinstance(record, dict):
            raise JournalFormatError(f"journal line must be a JSON object, got {type(record).__name__}")
        return cls.from_dict(record)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> JournalEvent:
        raw_type = record.get("event_type")
        try:
            event_type = EventType(raw_type)
        except ValueError:
            known = ", ".join(item.value for item in EventType)
            raise JournalFormatError(f"event_type = {raw_type!r}: unknown; expected one of {known}") from None
        for name in ("event_id", "op_id", "op_type", "purgatory"):
            if not isinstance(record.get(name), str):
                raise JournalFormatError(f"{name} = {record.get(name)!r}: must be a string")
        ts_ms = record.get("ts_ms")
        if isinstance(ts_ms, bool) or not isinstance(ts_ms, int):
            raise JournalFormatError(f"ts_ms = {ts_ms!r}: must be an integer (epoch milliseconds)")
        keys = record.get("keys") or []
        if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
            raise JournalFormatError(f"keys = {keys!r}: must be a list of strings")
        latency = record.get("latency_ms")
        if latency is not None and (isinstance(latency, bool) or not isinstance(latency, int | float)):
            raise JournalFormatError(f"latency_ms = {latency!r}: must be a number")
        error_code = record.get("error_code")
        if error_code is not None and not isinstance(error_code, str):
            raise JournalFormatError(f"error_code = {error_code!r}: must be a string (an error name)")
        timeout = record.get("timeout_ms")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int)):
            raise JournalFormatError(f"timeout_ms = {timeout!r}: must be an integer")
        return cls(
            event_id=record["event_id"],
            event_type=event_type,
            op_id=record["op_id"],
            op_type=record["op_type"],
            purgatory=record["purgatory"],
            ts_ms=ts_ms,
            keys=tuple(keys),
            timeout_ms=timeout,
            latency_ms=None if latency is None else float(latency),
            error_code=error_code,
        )
