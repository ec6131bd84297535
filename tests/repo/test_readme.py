"""The README's usage example runs as printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_usage_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    match = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README has a Python usage example"
    assert len(match.group(1).splitlines()) <= 25, "the usage example stays short"
    exec(compile(match.group(1), str(README), "exec"), {"__name__": "readme_example"})
    assert "orders-0 Outcome.COMPLETED" in capsys.readouterr().out


def test_readme_commands_are_the_ones_ci_runs() -> None:
    """The README's two commands: the set-up-and-run line, and the test command CI runs as written."""
    readme = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    setup = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/purgatory run"
    assert f"```bash\n{setup}\n```" in readme
    assert "```bash\n.venv/bin/python -m pytest\n```" in readme
    assert "\n.venv/bin/python -m pytest\n" in ci, ".ci/run runs the README's test command"
    assert "python3 -m venv .venv" in ci and ".venv/bin/pip install -q -e '.[dev]'" in ci


def test_readme_stays_a_short_guide() -> None:
    """Detail belongs on the documentation site (docs/, mkdocs.yml), not in the README."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 275, f"README has {len(lines)} lines: move detail to a page under docs/"
    assert not re.search(r"Since \d{4}-\d\d-\d\d", README.read_text()), "no dated measurement paragraphs"
