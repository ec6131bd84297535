"""Build hook: compile the timer's hot modules with mypyc, or fall back to pure Python.

Everything else about the distribution lives in pyproject.toml. The modules in
``purgatory._accel.COMPILED_MODULES`` are typed, slotted code that mypyc turns into native
classes (2.5-3.7x faster than the same code interpreted, docs/performance.md). If mypyc or a C
compiler is missing, or compiling fails, the build still succeeds and installs the pure-Python
package (the same sources). Set ``PURGATORY_PURE_BUILD=1`` to skip compiling on purpose.

One small C extension is built beside them, on its own: ``purgatory.adapters.service.http.
_send_share``, the fan-out's socket sends without the GIL (``adapters/service/http/
_fanout_writes.py``). Its failure leaves the Python sender, whose results are the same, and does
not touch the timer's extensions.

Next to the extensions the build writes ``purgatory/_compiled_sources.json`` (the SHA-256 of
each compiled source), which ``purgatory/_accel.py`` checks at import: after editing a compiled
module in an editable install, the stale extension is ignored (with a warning) until you rebuild
with ``pip install -e .``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _accel_constant(name: str) -> Any:
    """A constant of purgatory/_accel.py, read without importing the package (its dependencies
    are not in the build environment): the one list of compiled modules lives there."""
    tree = ast.parse((HERE / "purgatory" / "_accel.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"purgatory/_accel.py defines no {name}")


COMPILED_MODULES: tuple[str, ...] = _accel_constant("COMPILED_MODULES")
MANIFEST: str = _accel_constant("MANIFEST")


def _source(name: str) -> str:
    """``timer._task`` -> ``purgatory/timer/_task.py`` (as purgatory/_accel.py's ``source``)."""
    return "purgatory/" + name.replace(".", "/") + ".py"


def _sources() -> list[str]:
    return [_source(name) for name in COMPILED_MODULES]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a compile error leaves the pure-Python modules."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # a missing compiler surfaces here (CCompilerError, OSError, ...)
            self._give_up(exc)
            return
        self._write_manifest()

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._give_up(exc)
            raise

    def _give_up(self, exc: BaseException) -> None:
        print(f"kafka-purgatory: compiling the timer failed ({exc}); installing pure Python", file=sys.stderr)
        # Remove what was built, so no half-set of extensions shadows the sources.
        for ext in self.extensions:
            if ext.name == SEND_SHARE.name:  # on its own (module docstring)
                continue
            for path in (Path(self.get_ext_fullpath(ext.name)),):
                if path.exists() and self.inplace:
                    path.unlink()

    def _write_manifest(self) -> None:
        digests = {name: _digest(HERE / _source(name)) for name in COMPILED_MODULES}
        targets = {Path(self.get_ext_fullpath("purgatory._outcome")).parent}
        if self.inplace:
            targets.add(HERE / "purgatory")
        for target in targets:
            target.mkdir(parents=True, exist_ok=True)
            (target / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


# The fan-out's sends without the GIL (module docstring); plain C, no mypyc needed. Optional:
# build_ext warns and goes on if it does not compile, and the Python sender is used.
SEND_SHARE = Extension(
    "purgatory.adapters.service.http._send_share",
    sources=["adapters/service/http/_send_share.c"],
    optional=True,
)


def _ext_modules() -> list[Any]:
    if os.environ.get("PURGATORY_PURE_BUILD", "") not in ("", "0"):
        return []
    return [*_timer_ext_modules(), SEND_SHARE]


def _timer_ext_modules() -> list[Any]:
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("kafka-purgatory: mypyc unavailable; installing pure Python", file=sys.stderr)
        return []
    old_cwd = os.getcwd()
    os.chdir(HERE)  # mypyc resolves module names from paths relative to the project root
    try:
        # group_name puts mypyc's shared runtime library inside the package
        # (purgatory/_native__mypyc.*.so) instead of a generic top-level module.
        # The build environment has only the build requirements: type-check the compiled modules
        # on their own, without the project's mypy config (its plugins) or third-party stubs.
        options = ["--config-file=", "--follow-imports=silent", "--ignore-missing-imports"]
        return list(mypycify([*options, *_sources()], opt_level="3", group_name="purgatory._native"))
    except Exception as exc:
        print(f"kafka-purgatory: mypyc failed ({exc}); installing pure Python", file=sys.stderr)
        return []
    finally:
        os.chdir(old_cwd)


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
