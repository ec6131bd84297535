"""Request errors of the example service: an HTTP status and a JSON body naming the field at fault."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

__all__ = [
    "REQUEST_HEADER_FIELDS_TOO_LARGE",
    "UNEXPECTED_ERROR_BODY",
    "RequestError",
    "from_validation_error",
    "json_safe_text",
]

REQUEST_HEADER_FIELDS_TOO_LARGE = 431  # RFC 6585
# What a bug is answered with (a JSON 500), by the app's catch-all and by the protocols' fast paths.
UNEXPECTED_ERROR_BODY = {
    "error": "UNKNOWN_SERVER_ERROR",
    "field": None,
    "message": "unexpected error (logged)",
}
MAX_ECHOED_VALUE_CHARS = 80  # echo short values only: a client's 4 MiB body is not worth repeating


def json_safe_text(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (``"\\ud800"`` in a client's JSON, or a
    JSON object key) becomes its escape, so rendering an error about it cannot fail in turn."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _echoable(value: Any) -> Any:
    """``value`` if it is short and renders as strict JSON (finite numbers, UTF-8 text), else None."""
    if isinstance(value, bool | int):
        return value if abs(value) < 10**MAX_ECHOED_VALUE_CHARS else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # NaN and Infinity are not JSON
    if isinstance(value, str) and len(value) <= MAX_ECHOED_VALUE_CHARS:
        return json_safe_text(value)
    return None


class RequestError(Exception):
    """A request the service refuses: ``status`` (4xx/5xx), a Kafka-style ``code``, the ``field``.

    Rendered as ``{"error": code, "field": field, "message": message}`` (plus ``value`` when the
    offending value is safe and short to echo).
    """

    def __init__(
        self,
        status: int,
        code: str,
        field: str | None,
        message: str,
        *,
        value: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        # Field names and messages may quote what the client sent: kept renderable as JSON.
        self.field = None if field is None else json_safe_text(field)
        self.message = json_safe_text(message)
        self.value = _echoable(value)
        self.headers = headers  # e.g. Retry-After of a 429

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "field": self.field, "message": self.message}
        if self.value is not None:
            out["value"] = self.value
        return out


def _location(loc: tuple[int | str, ...]) -> str:
    """``("records", 0, "partition")`` -> ``records[0].partition``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def from_validation_error(error: ValidationError, *, where: str) -> RequestError:
    """The first problem pydantic found, as a 400 naming its field (``where``: query, body)."""
    first = error.errors()[0]
    field = _location(tuple(first["loc"])) or where
    shown = first.get("input")  # echoed only when short and strict JSON (RequestError)
    message = f"{field}: {first['msg']}"
    if len(error.errors()) > 1:
        message += f" (and {len(error.errors()) - 1} more problem(s))"
    return RequestError(400, "INVALID_REQUEST", field, message, value=shown)
