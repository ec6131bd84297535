"""Dependencies point down: core <- adapters <- tools, checked on every import in the tree.

Each source file is read with ``ast`` (nothing is imported), so an import inside a function, an
``if TYPE_CHECKING`` block or an ``importlib.import_module("...")`` string counts as much as a
module-level one: hiding an upward dependency from import checkers does not hide it from here.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Source folder -> the package it is installed as (pyproject.toml's package-dir mapping).
TREES = {"purgatory": "purgatory", "adapters": "purgatory.adapters", "tools": "purgatory.tools"}
# What each component may import of ours, besides itself.
ALLOWED = {"core": {"core"}, "adapters": {"core"}, "tools": {"core", "adapters"}}
# Third-party clients only adapters (and the tools driving them) may use.
ADAPTER_LIBRARIES = ("confluent_kafka", "pyspark", "starlette", "uvicorn", "testcontainers")


def component(module: str) -> str | None:
    """core / adapters / tools for a module of ours, None for anything else."""
    if module == "purgatory.adapters" or module.startswith("purgatory.adapters."):
        return "adapters"
    if module == "purgatory.tools" or module.startswith("purgatory.tools."):
        return "tools"
    if module == "purgatory" or module.startswith("purgatory."):
        return "core"
    return None


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Installed module name -> source file, for every .py file of the three trees."""
    modules: dict[str, Path] = {}
    for folder, package in TREES.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _string_argument(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, with its line: statements, relative ones resolved, and
    ``importlib.import_module`` / ``__import__`` calls on a string literal."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # ``from purgatory import adapters`` names a submodule: count it as one.
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                literal = _string_argument(node)
                if literal is not None:
                    found.append((node.lineno, literal))
    return found


def upward_dependencies(root: Path = ROOT) -> list[str]:
    modules = module_files(root)
    problems: list[str] = []
    for module, path in modules.items():
        own = component(module)
        assert own is not None
        for line, target in imports_of(module, path):
            other = component(target)
            where = f"{path.relative_to(root)}:{line}"
            if other is not None and other != own and other not in ALLOWED[own]:
                # A name imported from a package (``from purgatory import X``) is not a module.
                if target not in modules and target.rpartition(".")[0] in modules:
                    parent = component(target.rpartition(".")[0])
                    if parent == own or parent in ALLOWED[own]:
                        continue
                problems.append(f"{where}: {own} module {module} imports {other} module {target}")
            top = target.partition(".")[0]
            if own == "core" and top in ADAPTER_LIBRARIES:
                problems.append(f"{where}: core module {module} imports {top}")
    return list(dict.fromkeys(problems))  # ``from x import a, b`` reports x once


def is_private(module: str) -> bool:
    """A module (or name) below ``purgatory.adapters`` one of whose parts starts with ``_``."""
    parts = module.split(".")[2:] if module.startswith("purgatory.adapters.") else []
    return any(part.startswith("_") for part in parts)


def reaches(root: Path, importer: str, forbidden: Callable[[str], bool]) -> list[str]:
    """``file:line: module imports target`` for every import by a module of ``importer`` (a
    package, itself included) of a target ``forbidden`` says no to."""
    problems: list[str] = []
    for module, path in module_files(root).items():
        if module != importer and not module.startswith(importer + "."):
            continue
        for line, target in imports_of(module, path):
            if forbidden(target):
                problems.append(f"{path.relative_to(root)}:{line}: {module} imports {target}")
    return list(dict.fromkeys(problems))


def test_every_import_points_down_core_adapters_tools() -> None:
    problems = upward_dependencies()
    assert problems == [], "upward dependencies:\n" + "\n".join(problems)


def test_the_walk_sees_imports_hidden_in_functions_and_import_module_strings(tmp_path: Path) -> None:
    """The checker itself: an importlib string inside a function is an import like any other."""
    core = tmp_path / "purgatory"
    core.mkdir()
    (core / "__init__.py").write_text("")
    (core / "hidden.py").write_text(
        "import importlib\n\ndef kafka():\n    return importlib.import_module('purgatory.adapters.kafka')\n"
    )
    (core / "relative.py").write_text("def f():\n    from .tools import bench\n")
    (tmp_path / "adapters").mkdir()
    (tmp_path / "adapters" / "__init__.py").write_text("from purgatory.tools import bench\n")
    problems = upward_dependencies(tmp_path)
    assert any("purgatory/hidden.py:4" in p and "purgatory.adapters.kafka" in p for p in problems), problems
    assert any("purgatory/relative.py:2" in p and "purgatory.tools" in p for p in problems), problems
    assert any("adapters/__init__.py:1" in p for p in problems), problems


# Known, to go: the request-reply trace's "window=none" run emulates the sender before its
# in-flight window by replacing _sender.InFlightWindow (no public knob for it; issue 29).
def test_tools_use_the_adapters_through_their_public_faces() -> None:
    """Benchmarks and the reliability suite import ``purgatory.adapters.kafka``, never ``._feed``:
    an adapter may rearrange its private modules without breaking its tools."""
    problems = reaches(ROOT, "purgatory.tools", is_private)
    assert problems == [], "tools importing adapters' private modules:\n" + "\n".join(problems)


def test_the_kafka_adapter_does_not_import_the_service() -> None:
    """The service is built on the Kafka adapter; the Kafka adapter knows nothing of HTTP."""

    def service(target: str) -> bool:
        return target == "purgatory.adapters.service" or target.startswith("purgatory.adapters.service.")

    problems = reaches(ROOT, "purgatory.adapters.kafka", service)
    assert problems == [], "the Kafka adapter importing the service:\n" + "\n".join(problems)


def test_the_service_protocols_import_nothing_of_the_app() -> None:
    """The HTTP/1.1 and HTTP/2 protocols get the app's LongPollEndpoint at construction
    (adapters/service/http/_endpoint.py); they never reach into the ASGI app's modules."""

    def app(target: str) -> bool:
        room = "purgatory.adapters.service.app"
        return target == room or target.startswith(room + ".")

    problems = reaches(ROOT, "purgatory.adapters.service.http", app)
    assert problems == [], "the protocols importing the app:\n" + "\n".join(problems)


def test_the_private_check_sees_modules_and_names_of_adapters(tmp_path: Path) -> None:
    """The checker itself: a private module, a private name from a public module, a relative
    import inside the Kafka adapter that lands in the service."""
    for folder in ("purgatory", "tools", "adapters", "adapters/kafka", "adapters/service"):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "tools" / "probe.py").write_text(
        "from purgatory.adapters.kafka._feed import ChangeFeed\n"
        "from purgatory.adapters.kafka import _sender, ChangeFeed as Public\n"
    )
    (tmp_path / "adapters" / "kafka" / "redirect.py").write_text("from ..service import create_app\n")
    private = reaches(tmp_path, "purgatory.tools", is_private)
    assert any("tools/probe.py:1" in p and "kafka._feed" in p for p in private), private
    assert any("tools/probe.py:2" in p and "kafka._sender" in p for p in private), private
    assert not any(p.endswith("purgatory.adapters.kafka.ChangeFeed") for p in private), private

    def service(target: str) -> bool:
        return target.startswith("purgatory.adapters.service")

    upward = reaches(tmp_path, "purgatory.adapters.kafka", service)
    assert any("adapters/kafka/redirect.py:1" in p for p in upward), upward
