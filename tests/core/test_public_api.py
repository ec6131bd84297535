"""The public names of docs/design.md §3.5 import as documented."""

from __future__ import annotations

import pytest


def test_public_names_import_from_the_package() -> None:
    from purgatory import (  # noqa: F401
        DelayedOperation,
        DelayedOperationPurgatory,
        MockTimer,
        Outcome,
        PurgatoryClosedError,
        PurgatoryError,
        PurgatoryFullError,
        SystemTimer,
        TimerTask,
    )
    from purgatory.testing import MockTime
    from purgatory.testing import MockTimer as TestingMockTimer

    assert issubclass(PurgatoryFullError, PurgatoryError)
    assert issubclass(PurgatoryClosedError, PurgatoryError)
    assert MockTimer is TestingMockTimer
    assert MockTime(5).milliseconds() == 5


def test_adapters_are_installed_under_the_purgatory_namespace() -> None:
    import importlib.metadata
    import importlib.util

    assert importlib.util.find_spec("purgatory.adapters.kafka") is not None
    top_level = importlib.metadata.distribution("kafka-purgatory").read_text("top_level.txt") or ""
    assert top_level.split() == ["purgatory"], f"only 'purgatory' may be installed top-level: {top_level!r}"


def test_every_package_in_the_tree_is_listed_for_the_wheel() -> None:
    """Editable installs find any subpackage by path; a wheel ships only the listed ones."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    present = set()
    for top, name in (
        ("purgatory", "purgatory"),
        ("adapters", "purgatory.adapters"),
        ("tools", "purgatory.tools"),
    ):
        for init in (root / top).rglob("__init__.py"):
            rel = init.parent.relative_to(root / top).parts
            present.add(".".join((name, *rel)))
    assert present - listed == set(), "packages missing from [tool.setuptools] packages"


@pytest.mark.parametrize("method", ["force_complete", "is_completed", "on_expiration", "safe_try_complete"])
def test_help_shows_operation_method_docstrings_in_the_compiled_build_too(method: str) -> None:
    """mypyc drops compiled methods' docstrings; DelayedOperation declares the public ones again."""
    import inspect

    from purgatory import DelayedOperation, _accel

    doc = inspect.getdoc(getattr(DelayedOperation, method))
    assert doc, f"help(DelayedOperation.{method}) is empty ({_accel.status()})"


def test_help_of_delayed_operation_documents_outcome() -> None:
    import pydoc

    from purgatory import DelayedOperation

    text = pydoc.render_doc(DelayedOperation, renderer=pydoc.plaintext)
    assert "outcome: ``None`` until the operation finished" in text


def test_help_of_the_purgatory_summarises_its_compiled_methods() -> None:
    import pydoc

    from purgatory import DelayedOperationPurgatory

    text = pydoc.render_doc(DelayedOperationPurgatory, renderer=pydoc.plaintext)
    for method in ("try_complete_else_watch(op, keys)", "check_and_complete(key)", "cancel_for_key(key)"):
        assert method in text, f"help(DelayedOperationPurgatory) does not describe {method}"
