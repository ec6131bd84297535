"""structlog configuration: configured once, JSON in production, console on a terminal."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

from ._secrets import MASK, mask_secret_values

__all__ = ["configure_logging"]

_configured = threading.Lock()
_done = False

# Event keys whose values are credentials. Narrower than the settings' secret words: "key" is
# how log events name a watch key, and must stay readable.
_SECRET_WORDS = ("password", "secret", "token", "apikey", "api_key", "credential", "jaas")


def _mask_secrets(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # Defence in depth: settings hold credentials as SecretStr, but a caller might log a raw
    # value under a telling name. Never let it reach a sink. (By value: _masking_values.)
    for key in event:
        if any(word in key.lower() for word in _SECRET_WORDS):
            event[key] = MASK
    return event


def _masking_values(renderer: structlog.typing.Processor) -> structlog.typing.Processor:
    """``renderer`` whose rendered line has every known secret value masked (purgatory._secrets).

    Applied to the final line, so a secret inside a message, a logged config dict, an error
    text or a rendered traceback is masked alike, whatever name it travelled under.
    """

    def render(logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        line = renderer(logger, method, event)
        return mask_secret_values(line) if isinstance(line, str) else line

    return render


class _StderrLogger:
    """Writes each rendered line to the *current* ``sys.stderr``, and never raises.

    structlog's PrintLogger binds the file object once; if that stream is later closed or
    replaced (test runners, daemonised services), every log call would raise — and a log call
    inside a purgatory thread's error handler would then kill that thread.
    """

    def msg(self, message: str) -> None:
        # A closed or broken stderr must never take a purgatory thread down with it.
        with contextlib.suppress(ValueError, OSError):
            print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = critical = exception = fatal = failure = err = msg


def _logger_factory(*_args: Any) -> _StderrLogger:
    return _StderrLogger()


def _traceback_formatter() -> structlog.typing.ExceptionRenderer:
    try:
        return structlog.dev.RichTracebackFormatter(show_locals=False)
    except ModuleNotFoundError:  # pragma: no cover - rich is a dependency; plain tracebacks show no locals
        return structlog.dev.plain_traceback


def configure_logging(
    level: str = "INFO", fmt: Literal["auto", "json", "console"] = "auto", *, force: bool = False
) -> None:
    """Configure structlog for the process (once; later calls are ignored unless ``force``)."""
    global _done
    with _configured:
        if _done and not force:
            return
        _done = True
        use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
        renderer: structlog.typing.Processor = (
            structlog.processors.JSONRenderer()
            if use_json
            # Rich tracebacks show frames' local variables by default: credentials included.
            else structlog.dev.ConsoleRenderer(exception_formatter=_traceback_formatter())
        )
        processors: list[structlog.typing.Processor] = [
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _mask_secrets,
            structlog.processors.StackInfoRenderer(),
        ]
        if use_json:
            processors.append(structlog.processors.format_exc_info)  # the console renders its own
        processors.append(_masking_values(renderer))
        structlog.configure(
            processors=processors,
            wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level]),
            logger_factory=_logger_factory,
            cache_logger_on_first_use=False,
        )
