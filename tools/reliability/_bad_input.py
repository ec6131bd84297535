"""The bad-input matrix: every way of misusing the purgatory we know of, each with its typed error.

A :class:`BadInput` is one attempt: an action, the exception type it must raise, and the words
its message must contain (the field, the value, the reason). :func:`bad_input_matrix` builds the
whole matrix — settings from the environment and from TOML for every constrained field
(:mod:`._settings_fields`), API misuse, malformed journal lines — and :func:`run_bad_inputs` tries
each one, reporting those that were accepted or refused with the wrong error.

Concurrency: the settings cases change ``os.environ`` while they run (restored afterwards);
run the matrix from one thread, with no other thread reading ``PURGATORY_*`` variables.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from purgatory import DelayedOperation, DelayedOperationPurgatory, PurgatoryClosedError
from purgatory.journal import JournalEvent, JournalFormatError
from purgatory.settings import CONFIG_FILE_ENV, ConfigError, load_settings
from purgatory.testing import MockTimer

from ._settings_fields import env_name, invalid_env_values, invalid_toml_values, settings_fields, toml_text

__all__ = [
    "BadInput",
    "BadInputOutcome",
    "bad_input_matrix",
    "isolated_environment",
    "run_bad_inputs",
]


@dataclass(frozen=True)
class BadInput:
    """One misuse: ``action()`` must raise ``expected`` with every word of ``mentions`` in it."""

    category: str
    name: str
    action: Callable[[], object]
    expected: type[BaseException]
    mentions: tuple[str, ...] = ()


@dataclass(frozen=True)
class BadInputOutcome:
    case: BadInput
    error: str | None  # None: refused as it should be; else what went wrong

    @property
    def ok(self) -> bool:
        return self.error is None


@contextlib.contextmanager
def isolated_environment(variables: Mapping[str, str] | None = None) -> Iterator[None]:
    """Run with no ``PURGATORY_*`` variable but ``variables``; restore the environment after."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("PURGATORY_")}
    for name in saved:
        del os.environ[name]
    os.environ.update(variables or {})
    try:
        yield
    finally:
        for name in [k for k in os.environ if k.startswith("PURGATORY_")]:
            del os.environ[name]
        os.environ.update(saved)


class _Pending(DelayedOperation):
    """Never completes by itself."""

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass


def _purgatory() -> DelayedOperationPurgatory[DelayedOperation]:
    return DelayedOperationPurgatory("bad-input", timer=MockTimer(), reaper_enabled=False)


def _submit(keys: object) -> Callable[[], object]:
    def action() -> object:
        purgatory = _purgatory()
        try:
            return purgatory.try_complete_else_watch(_Pending(1000), keys)  # type: ignore[arg-type]
        finally:
            purgatory.shutdown(drain=True)

    return action


def _submit_after_shutdown() -> object:
    purgatory = _purgatory()
    purgatory.shutdown()
    return purgatory.try_complete_else_watch(_Pending(1000), ["k"])


def _env_case(variable: str, value: str) -> Callable[[], object]:
    def action() -> object:
        with isolated_environment({variable: value}):
            return load_settings()

    return action


def _env_input(variable: str, value: str, mention: str) -> BadInput:
    """``variable=value`` must be refused with a ConfigError mentioning ``mention``."""
    return BadInput(
        "settings (environment)", f"{variable}={value!r}", _env_case(variable, value), ConfigError, (mention,)
    )


def _toml_case(directory: Path, index: int, text: str) -> Callable[[], object]:
    def action() -> object:
        path = directory / f"case-{index}.toml"
        path.write_text(text, encoding="utf-8")
        with isolated_environment():
            return load_settings(path)

    return action


def _settings_cases(directory: Path) -> list[BadInput]:
    cases: list[BadInput] = []
    for spec in settings_fields():
        variable = env_name(spec)
        # Nested dict keys from the environment arrive lower-cased (pydantic-settings is case
        # insensitive), so only the leaf name is certain to appear as written.
        cases.extend(_env_input(variable, value, spec.path[-1]) for value in invalid_env_values(spec))
        for toml_value in invalid_toml_values(spec):
            text = toml_text(spec, toml_value)
            cases.append(
                BadInput(
                    "settings (TOML)",
                    f"{spec.dotted} = {toml_value!r}",
                    _toml_case(directory, len(cases), text),
                    ConfigError,
                    (spec.path[-1],),
                )
            )
    malformed = {
        "unclosed table": "[timer\ntick_ms = 1\n",
        "duplicate key": "purge_interval = 1\npurge_interval = 2\n",
        "unknown field": "tick_size = 3\n",
        "unknown section": "[reaper]\npoll_ms = 5\n",
        "not TOML": "this is : not toml",
        "binary": "\x00\x01\x02",
    }
    for name, text in malformed.items():
        cases.append(BadInput("settings (TOML)", name, _toml_case(directory, len(cases), text), ConfigError))
    missing = directory / "no-such-file.toml"
    cases.append(
        BadInput(
            "settings (TOML)",
            "missing file",
            _env_case(CONFIG_FILE_ENV, str(missing)),
            ConfigError,
            ("does not exist",),
        )
    )
    for variable, value in (
        ("PURGATORY_TIMER", "not json"),
        ("PURGATORY_TIMER", '{"tick_ms": 0}'),
        ("PURGATORY_PURGATORIES", "[1]"),
        ("PURGATORY_KAFKA", '{"feed_interval_ms": -5}'),
    ):
        cases.append(_env_input(variable, value, variable.removeprefix("PURGATORY_").lower()))
    return cases


def _api_cases() -> list[BadInput]:
    def construct(**kwargs: object) -> Callable[[], object]:
        def action() -> object:
            purgatory: DelayedOperationPurgatory[DelayedOperation] = DelayedOperationPurgatory(
                timer=MockTimer(),
                reaper_enabled=False,
                **kwargs,  # type: ignore[arg-type]
            )
            purgatory.shutdown()
            return purgatory

        return action

    def delay(value: object) -> Callable[[], object]:
        return lambda: _Pending(value)  # type: ignore[arg-type]

    def advance_back() -> object:
        return MockTimer().advance_clock(-1)

    return [
        BadInput("API", "unhashable key (list)", _submit([["a"]]), TypeError, ("unhashable",)),
        BadInput("API", "unhashable key (dict)", _submit(["ok", {"a": 1}]), TypeError, ("unhashable",)),
        BadInput("API", "unhashable key (set)", _submit([{1}]), TypeError, ("unhashable",)),
        BadInput("API", "no keys", _submit([]), ValueError, ("key",)),
        BadInput("API", "keys not iterable", _submit(5), TypeError),
        BadInput("API", "negative delay", delay(-1), ValueError, ("delay_ms", "-1")),
        BadInput("API", "fractional delay", delay(1.5), TypeError, ("delay_ms", "1.5")),
        BadInput("API", "delay as text", delay("100"), TypeError, ("delay_ms",)),
        BadInput("API", "delay as bool", delay(True), TypeError, ("delay_ms",)),
        BadInput("API", "use after shutdown", _submit_after_shutdown, PurgatoryClosedError, ("shut down",)),
        BadInput("API", "empty name", construct(name=""), ValueError, ("name",)),
        BadInput("API", "name not a string", construct(name=5), ValueError, ("name",)),
        BadInput(
            "API",
            "negative purge_interval",
            construct(name="p", purge_interval=-1),
            ValueError,
            ("purge_interval",),
        ),
        BadInput(
            "API",
            "purge_interval as bool",
            construct(name="p", purge_interval=True),
            ValueError,
            ("purge_interval",),
        ),
        BadInput("API", "zero max_pending", construct(name="p", max_pending=0), ValueError, ("max_pending",)),
        BadInput(
            "API",
            "fractional max_pending",
            construct(name="p", max_pending=2.5),
            ValueError,
            ("max_pending",),
        ),
        BadInput(
            "API",
            "zero reaper_poll_ms",
            construct(name="p", reaper_poll_ms=0),
            ValueError,
            ("reaper_poll_ms",),
        ),
        BadInput("API", "mock clock moved back", advance_back, ValueError, ("-1",)),
    ]


def _journal_cases() -> list[BadInput]:
    good = {
        "event_id": "op-1:created",
        "event_type": "created",
        "op_id": "op-1",
        "op_type": "T",
        "purgatory": "p",
        "ts_ms": 1,
        "keys": ["k"],
        "timeout_ms": 10,
    }

    def line(**changes: object) -> str:
        record: dict[str, object] = {**good, **changes}
        return json.dumps({k: v for k, v in record.items() if v is not _DROP})

    lines = {
        "not JSON": ("{event_type: created", ("not JSON",)),
        "empty line": ("", ("not JSON",)),
        "JSON array": ("[1, 2]", ("object",)),
        "unknown event_type": (line(event_type="exploded"), ("event_type", "exploded")),
        "missing op_id": (line(op_id=_DROP), ("op_id",)),
        "op_id not a string": (line(op_id=7), ("op_id", "7")),
        "ts_ms as text": (line(ts_ms="yesterday"), ("ts_ms", "yesterday")),
        "ts_ms as bool": (line(ts_ms=True), ("ts_ms",)),
        "keys not a list": (line(keys="k"), ("keys",)),
        "key not a string": (line(keys=[1]), ("keys",)),
        "latency as text": (line(event_type="completed", latency_ms="fast"), ("latency_ms", "fast")),
        "timeout fractional": (line(timeout_ms=1.5), ("timeout_ms", "1.5")),
        "invalid UTF-8": ("\udcff", ()),
    }
    return [
        BadInput("journal lines", name, _parse(text), JournalFormatError, words)
        for name, (text, words) in lines.items()
    ]


def _parse(line: str) -> Callable[[], object]:
    return lambda: JournalEvent.from_json(line)


_DROP = object()


def bad_input_matrix(directory: Path) -> list[BadInput]:
    """Every bad input; TOML files are written under ``directory``."""
    return [*_settings_cases(directory), *_api_cases(), *_journal_cases()]


def check(case: BadInput) -> BadInputOutcome:
    """Try one bad input: it must raise ``case.expected`` mentioning every word of ``case.mentions``."""
    try:
        result = case.action()
    except case.expected as exc:
        message = str(exc)
        missing = [word for word in case.mentions if word.lower() not in message.lower()]
        if missing:
            return BadInputOutcome(case, f"{type(exc).__name__} does not mention {missing}: {message!r}")
        return BadInputOutcome(case, None)
    except Exception as exc:
        return BadInputOutcome(case, f"expected {case.expected.__name__}, got {type(exc).__name__}: {exc}")
    return BadInputOutcome(case, f"accepted (returned {result!r:.80})")


def run_bad_inputs() -> list[BadInputOutcome]:
    """Try the whole matrix in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="purgatory-bad-input-") as scratch:
        return [check(case) for case in bad_input_matrix(Path(scratch))]
