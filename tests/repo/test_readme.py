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
