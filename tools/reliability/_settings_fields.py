"""The settings' fields and the values each must refuse, read from the settings model itself.

Walking :class:`purgatory.settings.Settings` (rather than listing fields by hand) keeps the
bad-input matrix complete as fields are added: every constrained field gets refused values.

A field's *kind* decides what is invalid for it:

* ``int>0`` / ``int>=0`` / ``int`` — out of range numbers, words, fractions;
* ``bool`` — words pydantic does not read as a boolean;
* ``literal`` — anything outside the allowed names (``choices``);
* ``literal-tuple`` — a list holding a name outside ``choices``;
* ``str>=1`` — the empty string;
* ``dict`` — a list instead of a table.

Unconstrained strings (and secrets) accept any value and have no invalid ones.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from purgatory.settings import Settings

__all__ = [
    "FieldSpec",
    "env_name",
    "invalid_env_values",
    "invalid_toml_values",
    "settings_fields",
    "toml_text",
]

# A per-purgatory override section is addressed by name; this one stands for any.
OVERRIDE_NAME = "Produce"


@dataclass(frozen=True)
class FieldSpec:
    """One leaf setting: its dotted path (as ConfigError names it) and what it accepts."""

    path: tuple[str, ...]
    kind: str
    choices: tuple[str, ...] = ()

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def _unwrap(annotation: object, metadata: list[object]) -> tuple[object, list[object]]:
    """Strip ``Optional`` and ``Annotated``, collecting constraints."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        arms = [arm for arm in typing.get_args(annotation) if arm is not type(None)]
        if len(arms) == 1:
            return _unwrap(arms[0], metadata)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return _unwrap(base, [*metadata, *extra])
    return annotation, metadata


def _kind(annotation: object, metadata: list[object]) -> tuple[str, tuple[str, ...]] | None:
    if annotation is bool:
        return "bool", ()
    if annotation is int:
        if any(isinstance(m, annotated_types.Gt) and m.gt == 0 for m in metadata):
            return "int>0", ()
        if any(isinstance(m, annotated_types.Ge) and m.ge == 0 for m in metadata):
            return "int>=0", ()
        return "int", ()
    if annotation is str:
        if any(isinstance(m, annotated_types.MinLen) and m.min_length >= 1 for m in metadata):
            return "str>=1", ()
        return None
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "literal", tuple(str(a) for a in typing.get_args(annotation))
    if origin is tuple:
        inner = typing.get_args(annotation)[0]
        if typing.get_origin(inner) is typing.Literal:
            return "literal-tuple", tuple(str(a) for a in typing.get_args(inner))
    if origin is dict and typing.get_args(annotation)[1] is str:
        return "dict", ()
    return None


def _walk(model: type[BaseModel], prefix: tuple[str, ...]) -> list[FieldSpec]:
    specs: list[FieldSpec] = []
    for name, info in model.model_fields.items():
        specs.extend(_field(info, (*prefix, name)))
    return specs


def _field(info: FieldInfo, path: tuple[str, ...]) -> list[FieldSpec]:
    annotation, metadata = _unwrap(info.annotation, list(info.metadata))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _walk(annotation, path)
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return _walk(value, (*path, OVERRIDE_NAME))
    kind = _kind(annotation, metadata)
    return [] if kind is None else [FieldSpec(path, kind[0], kind[1])]


def settings_fields() -> list[FieldSpec]:
    """Every constrained leaf field of :class:`Settings`, nested sections included."""
    return _walk(Settings, ())


def env_name(spec: FieldSpec) -> str:
    """The environment variable setting ``spec`` (prefix ``PURGATORY_``, ``__`` nesting)."""
    return "PURGATORY_" + "__".join(part.upper() for part in spec.path)


def invalid_env_values(spec: FieldSpec) -> list[str]:
    """A few values of ``spec``'s environment variable that must be refused."""
    return {
        "int>0": ["0", "-3", "many", "1.5"],
        "int>=0": ["-1", "lots", "2.5"],
        "int": ["zero", "1e400", "0x10"],
        "bool": ["maybe", "2", "enabled"],
        "literal": ["bogus", "", *[c.swapcase() + "x" for c in spec.choices[:1]]],
        "literal-tuple": ['["nope"]', "[1]"],
        "str>=1": [""],
        "dict": ["[1, 2]", '"text"'],
    }[spec.kind]


def invalid_toml_values(spec: FieldSpec) -> list[object]:
    """A few TOML values of ``spec`` that must be refused (typed: numbers, strings, lists)."""
    values: dict[str, list[object]] = {
        "int>0": [0, -3, "many", 1.5, [1]],
        "int>=0": [-1, "lots", 2.5],
        "int": ["zero", 1.5, {"a": 1}],
        "bool": ["maybe", 2, [True]],
        "literal": ["bogus", 3, [spec.choices[0]] if spec.choices else 0],
        "literal-tuple": [["nope"], "file,kafka", [1]],
        "str>=1": ["", 5],
        "dict": [[1, 2], "text", {"a": 1}],
    }
    return values[spec.kind]


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # ints, floats and JSON strings are valid TOML literals


def toml_text(spec: FieldSpec, value: object) -> str:
    """A TOML document setting only ``spec`` to ``value``."""
    *section, leaf = spec.path
    header = f"[{'.'.join(section)}]\n" if section else ""
    return f"{header}{leaf} = {_toml_value(value)}\n"
