"""Every document the code and the README cite is in the repository, and the README's layout
table names folders that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("purgatory", "adapters", "tools", "tests")


def _texts() -> dict[Path, str]:
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "setup.py"]
    for top in SOURCES:
        files.extend((ROOT / top).rglob("*.py"))
    return {path: path.read_text() for path in files}


def test_every_cited_doc_exists() -> None:
    cited = {
        (path.relative_to(ROOT), name)
        for path, text in _texts().items()
        for name in re.findall(r"docs/[\w.-]+\.md", text)
    }
    assert cited, "the design and performance notes are cited somewhere"
    missing = sorted(f"{where}: {name}" for where, name in cited if not (ROOT / name).is_file())
    assert missing == [], missing


def test_no_citation_points_outside_the_repository() -> None:
    stale = sorted(
        str(path.relative_to(ROOT))
        for path, text in _texts().items()
        if path != Path(__file__).resolve() and re.search(r"DESIGN §|(?<!docs/)PERFORMANCE\.md", text)
    )
    assert stale == [], f"cite docs/design.md or docs/performance.md instead: {stale}"


def test_readme_layout_table_names_existing_paths() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout") :].split("\n## ", 1)[0]
    paths = re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)
    assert {"purgatory/", "purgatory/timer/", "adapters/", "tools/", "tests/", "docs/"} <= set(paths)
    assert [p for p in paths if not (ROOT / p).is_dir()] == []
