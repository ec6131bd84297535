"""Compiled or pure timer modules: the choice is explicit, all-or-nothing, and never stale.

``purgatory/_accel.py`` decides at import; these tests run the decision in fresh interpreters
(the choice is made once per process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import purgatory
from purgatory import _accel

PACKAGE_DIR = Path(purgatory.__file__).resolve().parent
FAKE_EXTENSION_SUFFIX = ".cpython-311-x86_64-linux-gnu.so"

_PROBE = (
    "import json, purgatory, purgatory.timer._task as t, purgatory.testing as m; "
    "from purgatory import _accel; "
    "print(json.dumps({'compiled': _accel.compiled(), 'status': _accel.status(), "
    "'files': [t.__file__, m.__file__]}))"
)


def _probe(pythonpath: Path | None = None, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != "PURGATORY_PURE"} | env
    if pythonpath is not None:
        environ["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _PROBE],
        capture_output=True,
        text=True,
        env=environ,
        cwd=pythonpath or Path.cwd(),
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_pure_env_loads_every_timer_module_from_its_source() -> None:
    result = _probe(PURGATORY_PURE="1")
    assert result["compiled"] is False
    assert "PURGATORY_PURE" in str(result["status"])
    files = result["files"]
    assert isinstance(files, list) and all(str(f).endswith(".py") for f in files), files


def test_a_source_edited_after_the_build_makes_every_module_pure(tmp_path: Path) -> None:
    """Stale extensions never shadow edited sources silently: all compiled modules are dropped."""
    copy = tmp_path / "purgatory"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "bench"))
    # Whether or not this checkout is compiled, give every module an "extension" and a manifest
    # that matches all sources but one: the edited one.
    digests = {}
    for name in _accel.COMPILED_MODULES:
        stem = copy.joinpath(*name.split("."))
        if not any(stem.parent.glob(f"{stem.name}.cpython-*.so")):
            stem.with_name(stem.name + FAKE_EXTENSION_SUFFIX).write_bytes(b"not a real extension")
        digests[name] = _accel._digest(stem.with_suffix(".py"))
    digests["timer._timing_wheel"] = "0" * 64  # built from an older timer/_timing_wheel.py
    (copy / _accel.MANIFEST).write_text(json.dumps(digests))
    result = _probe(pythonpath=tmp_path)
    assert result["compiled"] is False
    assert "stale" in str(result["status"]) and "timer._timing_wheel" in str(result["status"])
    files = result["files"]
    assert isinstance(files, list) and all(str(f).endswith(".py") for f in files), files


def test_no_extensions_means_pure_without_warning(tmp_path: Path) -> None:
    copy = tmp_path / "purgatory"
    shutil.copytree(
        PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "bench", "*.so", _accel.MANIFEST)
    )
    result = _probe(pythonpath=tmp_path)
    assert result == {
        "compiled": False,
        "status": "pure Python (no compiled modules installed)",
        "files": [str(copy / "timer" / "_task.py"), str(copy / "testing.py")],
    }


def test_setup_compiles_exactly_the_modules_accel_guards() -> None:
    setup_py = PACKAGE_DIR.parent / "setup.py"
    if not setup_py.exists():  # an installed (non-editable) copy: nothing to compare
        return
    import ast

    tree = ast.parse(setup_py.read_text())
    reads = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "_accel_constant"
        and isinstance(node.args[0], ast.Constant)
    ]
    assert reads == ["COMPILED_MODULES", "MANIFEST"], "setup.py takes its module list from _accel.py"
    for name in _accel.COMPILED_MODULES:
        assert _accel.source(name).exists(), f"{name} is listed for compiling but has no source"
