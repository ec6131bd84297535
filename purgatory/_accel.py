"""Choose compiled or pure-Python timer modules, once, before any of them is imported.

The timer's hot modules (``COMPILED_MODULES``) may exist twice in the package: as ``.py``
sources and as mypyc extensions built from them (``setup.py``). Python's import system prefers an
extension over a source of the same name, so an extension built before an edit would silently
shadow the edited source. This module prevents that:

* ``PURGATORY_PURE=1`` in the environment: always load the sources (CI runs the unit tests a
  second time this way, so both variants pass the same suite).
* Otherwise the extensions are used only if the build's manifest ``_compiled_sources.json``
  records, for every compiled module, the SHA-256 of the source as it is now. If any source
  changed since the build, *all* compiled modules are ignored (compiled and pure classes cannot
  be mixed: compiled code checks for its own native classes), a warning says so, and
  ``pip install -e .`` rebuilds them.

All or nothing is decided here and enforced by a meta-path finder that maps the module names to
their ``.py`` files. ``status()`` tells which variant is running (``purgatory bench`` prints it).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED_MODULES", "PURE_ENV", "compiled", "source", "status"]

PURE_ENV = "PURGATORY_PURE"
PACKAGE = "purgatory"
# setup.py reads this tuple (with ast) to know what to compile. Dotted names are submodules
# (``timer._task`` is purgatory/timer/_task.py); ``source()`` maps a name to its file.
COMPILED_MODULES = (
    "timer._task",
    "timer._task_list",
    "timer._timing_wheel",
    "timer._delay_queue",
    "timer._wheel_timer",
    "timer._system_timer",
    "testing",
    "_outcome",
    "_metrics",
    "_operation_core",
    "_watchers",
    "_purgatory_core",
)
MANIFEST = "_compiled_sources.json"

_HERE = Path(__file__).resolve().parent


class _PureSourceFinder:
    """Meta-path finder that loads the listed modules from their ``.py`` sources."""

    def __init__(self, names: dict[str, Path]) -> None:
        self._names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        source = self._names.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def source(name: str) -> Path:
    """The ``.py`` file of compiled module ``name`` (``timer._task`` -> purgatory/timer/_task.py)."""
    return _HERE.joinpath(*name.split(".")).with_suffix(".py")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _has_extension(name: str) -> bool:
    stem = _HERE.joinpath(*name.split("."))
    return any(
        stem.with_name(stem.name + suffix).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _decide() -> tuple[bool, str]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"pure Python ({PURE_ENV} is set)"
    if not any(_has_extension(name) for name in COMPILED_MODULES):
        return False, "pure Python (no compiled modules installed)"
    try:
        manifest = json.loads((_HERE / MANIFEST).read_text())
    except (OSError, ValueError):
        manifest = {}
    stale = [
        name
        for name in COMPILED_MODULES
        if not _has_extension(name)
        or not source(name).exists()
        or manifest.get(name) != _digest(source(name))
    ]
    if stale:
        warnings.warn(
            f"purgatory: compiled modules are older than their sources ({', '.join(stale)}); using the "
            "pure-Python sources. Rebuild with `pip install -e .` "
            "(or `python setup.py build_ext --inplace`).",
            RuntimeWarning,
            stacklevel=3,
        )
        return False, f"pure Python (stale compiled modules ignored: {', '.join(stale)})"
    return True, "compiled (mypyc)"


_COMPILED, _STATUS = _decide()
if not _COMPILED:
    # Sources may be missing in a compiled-only install; then let normal import find the extension.
    _sources = {f"{PACKAGE}.{name}": source(name) for name in COMPILED_MODULES if source(name).exists()}
    sys.meta_path.insert(0, _PureSourceFinder(_sources))


def compiled() -> bool:
    """True when the timer runs the mypyc-compiled modules."""
    return _COMPILED


def status() -> str:
    """One line saying which variant runs and why."""
    return _STATUS
