"""Credentials: which names mark one, and which values this process holds, so both can be masked.

Why both. Masking by *name* (``sasl.password``, ``my.apikey``, ``service.auth_tokens``) covers
values that travel under their setting's name: settings dumps, ``purgatory config show``, the
client configs the adapters log. It cannot cover a value that escapes under another name: an
error message from librdkafka quoting an invalid property value, an f-string in a log event,
an exception text. So every secret the settings hold is also remembered by *value* here
(:func:`remember_secret`, called when a settings section is built) and :func:`mask_secret_values`
replaces it wherever it appears in a string about to be shown or logged.

Concurrency contract: thread-safe. Values are only ever added (a process holds a few secrets;
forgetting one a log line could still quote would be the wrong trade).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

__all__ = ["MASK", "MIN_MASKED_CHARS", "is_secret_name", "mask_secret_values", "remember_secret"]

MASK = "**********"  # what pydantic shows for a SecretStr: one look for every masked value
# Shorter values are not masked by value: replacing every "ab" in every log line would make the
# logs unreadable and protect nothing a guesser could not try anyway.
MIN_MASKED_CHARS = 6

# Words that mark a setting or librdkafka property name as holding a credential, matched
# anywhere in the lower-cased name: "key" covers my.apikey, api_key, ssl.key.pem, keystore;
# "oauthbearer" covers sasl.oauthbearer.config and .client.secret. Masking a non-secret that
# happens to match (ssl.key.location, a path) costs a little readability, never a leak.
SECRET_NAME_WORDS = (
    "password",
    "passwd",
    "secret",
    "key",
    "token",
    "credential",
    "jaas",
    "oauthbearer",
    "private",
)

_lock = threading.Lock()
_values: frozenset[str] = frozenset()
_pattern: re.Pattern[str] | None = None


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """True when a setting or client property called ``name`` holds a credential.

    ``extra``: names declared secret explicitly (``kafka.secret_keys``), matched exactly.
    """
    lowered = name.lower()
    return name in extra or any(word in lowered for word in SECRET_NAME_WORDS)


def remember_secret(value: str) -> None:
    """Mask ``value`` by value from now on (no-op below :data:`MIN_MASKED_CHARS`)."""
    global _values, _pattern
    if len(value) < MIN_MASKED_CHARS or value in _values:
        return
    with _lock:
        values = _values | {value}
        # Longest first: a secret that contains another is masked whole, not in pieces.
        ordered = sorted(values, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(v) for v in ordered))
        _values = values


def mask_secret_values(text: str) -> str:
    """``text`` with every remembered secret value replaced by :data:`MASK`."""
    pattern = _pattern  # one read: a concurrent remember_secret swaps it whole
    if pattern is None or not text:
        return text
    return pattern.sub(MASK, text)
