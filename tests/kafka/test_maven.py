"""The adapters' one Maven resolver (Kafka's jars, Spark's connector): resolved once, never
half-resolved. A stand-in ``mvn`` script on PATH plays Maven (no network); the real Maven runs
in tests/kafka/test_local_cluster.py and the Spark tests."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from purgatory.adapters._maven import MavenError, copy_dependencies, is_resolved

_FAKE_MVN = """#!/bin/sh
echo run >> "{calls}"
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}";; esac
done
[ "{mode}" = fail ] && {{ echo "could not resolve artifact"; exit 1; }}
[ "{mode}" = empty ] && exit 0
touch "$out/kafka_2.13-4.3.1.jar" "$out/kafka-clients-4.3.1.jar"
"""


def _fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    script = bin_dir / "mvn"
    script.write_text(_FAKE_MVN.format(calls=calls, mode=mode))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _resolve(into: Path) -> Path:
    return copy_dependencies(
        Path("pom.xml"),
        into,
        {"kafka.version": "4.3.1"},
        expect="kafka_2.13-*.jar",
        what="Kafka",
        timeout_s=30,
    )


def test_resolves_once_then_reuses_the_marked_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_mvn(tmp_path, monkeypatch, "ok")
    into = tmp_path / "cache" / "kafka-4.3.1" / "libs"
    assert _resolve(into) == into
    assert is_resolved(into) and (into / "kafka_2.13-4.3.1.jar").is_file()
    _resolve(into)
    assert calls.read_text().splitlines() == ["run"], "the second call must not run Maven again"
    assert sorted(p.name for p in into.parent.iterdir()) == ["libs"], "no staging directory left behind"


@pytest.mark.parametrize("mode", ["fail", "empty"])
def test_a_failed_resolution_leaves_nothing_that_looks_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    _fake_mvn(tmp_path, monkeypatch, mode)
    into = tmp_path / "cache" / "libs"
    with pytest.raises(MavenError, match="Maven could not resolve Kafka") as caught:
        _resolve(into)
    assert "command: " in str(caught.value)
    assert not into.exists() and list(into.parent.iterdir()) == []


def test_missing_maven_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MavenError, match=r"Maven \('mvn'\) is not on PATH.*Kafka"):
        _resolve(tmp_path / "libs")
