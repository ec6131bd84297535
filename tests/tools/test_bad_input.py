"""Bad input matrix: every invalid setting, API misuse and malformed journal line gets a typed error.

The fixed matrix (``purgatory.tools.reliability._bad_input``, also run by ``purgatory bench
reliability``) covers every constrained settings field, from the environment and from TOML, read
from the settings model itself. Hypothesis then fuzzes the same fields with generated invalid
values, TOML documents and journal lines.
"""

from __future__ import annotations

import contextlib
import json
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from purgatory.tools.reliability import (
    FieldSpec,
    bad_input_matrix,
    check,
    env_name,
    isolated_environment,
    settings_fields,
    toml_text,
)

from purgatory import DelayedOperation, DelayedOperationPurgatory, MockTimer, Outcome
from purgatory.journal import JournalEvent, JournalFormatError
from purgatory.settings import ConfigError, Settings, load_settings

_SCRATCH = Path(tempfile.mkdtemp(prefix="purgatory-bad-input-tests-"))
MATRIX = bad_input_matrix(_SCRATCH)
FIELDS = settings_fields()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("case", MATRIX, ids=[f"{c.category}: {c.name}" for c in MATRIX])
def test_each_bad_input_is_refused_with_a_typed_error_naming_it(case: object) -> None:
    outcome = check(case)  # type: ignore[arg-type]
    assert outcome.ok, outcome.error


def test_the_matrix_covers_every_constrained_settings_field() -> None:
    named = {c.name.split("=")[0].strip() for c in MATRIX}
    for spec in FIELDS:
        assert env_name(spec) in named, f"{spec.dotted}: no environment case"
        assert spec.dotted in named, f"{spec.dotted}: no TOML case"
    assert len(FIELDS) >= 30, "the settings walker lost fields"


# -- fuzzed settings ----------------------------------------------------------------------------

_BOOL_WORDS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}
_WORDS = st.text(alphabet=string.ascii_letters + "_-", min_size=1, max_size=12)
_FRACTIONS = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6).filter(
    lambda f: not f.is_integer()
)


def _invalid_env_value(spec: FieldSpec) -> st.SearchStrategy[str]:
    if spec.kind == "int>0":
        return st.one_of(st.integers(max_value=0).map(str), _WORDS, _FRACTIONS.map(repr))
    if spec.kind == "int>=0":
        return st.one_of(st.integers(max_value=-1).map(str), _WORDS, _FRACTIONS.map(repr))
    if spec.kind == "int":
        return st.one_of(_WORDS, _FRACTIONS.map(repr))
    if spec.kind == "bool":
        return st.one_of(_WORDS, st.integers(min_value=2).map(str)).filter(
            lambda w: w.lower() not in _BOOL_WORDS
        )
    if spec.kind == "literal":
        return st.text(min_size=0, max_size=12).filter(lambda w: w not in spec.choices and "\x00" not in w)
    if spec.kind == "literal-tuple":
        return st.lists(_WORDS.filter(lambda w: w not in spec.choices), min_size=1, max_size=3).map(
            lambda items: "[" + ", ".join(f'"{w}"' for w in items) + "]"
        )
    if spec.kind == "str>=1":
        return st.just("")
    assert spec.kind == "dict", spec
    return st.lists(st.integers(), max_size=3).map(str)


def _invalid_toml_value(spec: FieldSpec) -> st.SearchStrategy[object]:
    text = _WORDS
    if spec.kind == "int>0":
        return st.one_of(st.integers(max_value=0), text, _FRACTIONS, st.lists(st.integers(), max_size=2))
    if spec.kind == "int>=0":
        return st.one_of(st.integers(max_value=-1), text, _FRACTIONS)
    if spec.kind == "int":
        return st.one_of(text, _FRACTIONS)
    if spec.kind == "bool":
        return st.one_of(
            text.filter(lambda w: w.lower() not in _BOOL_WORDS), st.integers(min_value=2), _FRACTIONS
        )
    if spec.kind == "literal":
        return st.one_of(text.filter(lambda w: w not in spec.choices), st.integers())
    if spec.kind == "literal-tuple":
        return st.lists(text.filter(lambda w: w not in spec.choices), min_size=1, max_size=3)
    if spec.kind == "str>=1":
        return st.one_of(st.just(""), st.integers(), st.lists(text, max_size=2))
    assert spec.kind == "dict", spec
    return st.one_of(st.lists(st.integers(), max_size=3), text)


@FUZZ
@given(data=st.data(), spec=st.sampled_from(FIELDS))
def test_fuzzed_invalid_environment_values_are_refused_naming_the_field(
    data: st.DataObject, spec: FieldSpec
) -> None:
    value = data.draw(_invalid_env_value(spec), label="value")
    with isolated_environment({env_name(spec): value}), pytest.raises(ConfigError) as info:
        load_settings()
    assert spec.path[-1] in str(info.value), f"{env_name(spec)}={value!r}: {info.value}"


@FUZZ
@given(data=st.data(), spec=st.sampled_from(FIELDS))
def test_fuzzed_invalid_toml_values_are_refused_naming_the_field(
    data: st.DataObject, spec: FieldSpec
) -> None:
    value = data.draw(_invalid_toml_value(spec), label="value")
    path = _SCRATCH / "fuzz.toml"
    path.write_text(toml_text(spec, value), encoding="utf-8")
    with isolated_environment(), pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert spec.path[-1] in message, f"{spec.dotted} = {value!r}: {message}"


@FUZZ
@given(text=st.text(max_size=200))
def test_any_toml_document_loads_or_is_refused_with_config_error(text: str) -> None:
    path = _SCRATCH / "any.toml"
    try:
        path.write_text(text, encoding="utf-8")
    except UnicodeEncodeError:
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
    with isolated_environment():
        try:
            loaded = load_settings(path)
        except ConfigError:
            return
    assert isinstance(loaded, Settings)


# -- journal lines ------------------------------------------------------------------------------

_JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = [
    "event_id",
    "event_type",
    "op_id",
    "op_type",
    "purgatory",
    "ts_ms",
    "keys",
    "timeout_ms",
    "latency_ms",
]


@FUZZ
@given(line=st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_any_journal_line_parses_or_is_refused_with_journal_format_error(line: str | bytes) -> None:
    with contextlib.suppress(JournalFormatError):
        JournalEvent.from_json(line)


@FUZZ
@given(
    record=st.fixed_dictionaries(
        {},
        optional={
            name: st.one_of(_JSON, st.sampled_from(["created", "completed", "expired"])) for name in _FIELDS
        },
    )
)
def test_journal_records_with_wrong_fields_are_refused_naming_the_field(record: dict[str, object]) -> None:
    try:
        event = JournalEvent.from_json(json.dumps(record))
    except JournalFormatError as exc:
        assert any(name in str(exc) for name in _FIELDS), f"the error names no field: {exc}"
        return
    assert event.op_id == record["op_id"] and event.ts_ms == record["ts_ms"]


def test_a_deeply_nested_journal_line_is_refused_with_a_typed_error() -> None:
    with pytest.raises(JournalFormatError):
        JournalEvent.from_json("[" * 100_000)


# -- API misuse beyond the matrix -------------------------------------------------------------


class _Pending(DelayedOperation):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass


def _mock_purgatory(name: str = "misuse") -> DelayedOperationPurgatory[DelayedOperation]:
    return DelayedOperationPurgatory(name, timer=MockTimer(), reaper_enabled=False)


def test_a_single_string_passed_as_keys_is_refused() -> None:
    purgatory = _mock_purgatory()
    try:
        with pytest.raises(TypeError):
            purgatory.try_complete_else_watch(_Pending(100), "topic-0")  # type: ignore[arg-type]
    finally:
        purgatory.shutdown()


def test_submitting_something_that_is_not_an_operation_is_refused_with_a_type_error() -> None:
    purgatory = _mock_purgatory()
    try:
        with pytest.raises(TypeError):
            purgatory.try_complete_else_watch(object(), ["k"])  # type: ignore[arg-type]
    finally:
        purgatory.shutdown()


def test_resubmitting_a_pending_operation_still_finishes_it_once() -> None:
    """Accepted today (re-adding replaces its timer entry): it must still finish exactly once and
    leave no watcher behind in either purgatory once finished and purged."""
    first, second = _mock_purgatory("first"), _mock_purgatory("second")
    finished: list[Outcome | None] = []

    class Recorded(_Pending):
        def on_complete(self) -> None:
            finished.append(self.outcome)

    op = Recorded(1000)
    first.try_complete_else_watch(op, ["k"])
    second.try_complete_else_watch(op, ["k"])
    assert op.force_complete()
    assert finished == [Outcome.COMPLETED]
    first.purge_completed()
    second.purge_completed()
    assert first.watched() == 0 and second.watched() == 0
    assert first.num_delayed() == 0 and second.num_delayed() == 0
    first.shutdown()
    second.shutdown()
    assert finished == [Outcome.COMPLETED], "drain must not finish it again"


def test_a_boolean_for_an_integer_setting_is_refused() -> None:
    path = _SCRATCH / "bool-int.toml"
    path.write_text("max_pending = true\n", encoding="utf-8")
    with isolated_environment(), pytest.raises(ConfigError, match="max_pending"):
        load_settings(path)
