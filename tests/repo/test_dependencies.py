"""Every third-party module the shipped code imports is a declared dependency of the distribution.

A module that arrives only as a dependency of a dependency (h11 through uvicorn, hpack through
h2) works until that dependency drops it; a fresh install in CI then fails at import.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("purgatory", "adapters", "tools")
OWN = {"purgatory", "adapters", "tools", "tests", "examples"}


def _imported_top_level_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in SHIPPED:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], path)
    return found


def _declared_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements.extend(extra)
    names = {re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0] for requirement in requirements}
    return {_normalized(name) for name in names}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_module_the_code_imports_is_declared() -> None:
    declared = _declared_distributions()
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module, path in _imported_top_level_modules().items():
        if module in OWN or module in sys.stdlib_module_names or module == "__future__":
            continue
        providers = {_normalized(d) for d in distributions.get(module, [])}
        if providers and not providers & declared:
            undeclared[module] = (sorted(providers), str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
