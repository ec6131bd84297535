"""One Maven resolver for the adapters' jars: Apache Kafka's broker (``kafka/local``) and Spark's
Kafka connector (``spark/_jars.py``).

``mvn dependency:copy-dependencies`` copies a pom's dependencies into a staging directory beside
the target; a marker file is written last and the staging directory renamed onto the target, so
an interrupted run leaves nothing that looks resolved, and two processes resolving at once keep
whichever landed first. Imports nothing but the core: the Spark adapter uses it without the
Kafka client installed.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from purgatory import PurgatoryError

__all__ = ["RESOLVED_MARKER", "MavenError", "copy_dependencies", "is_resolved", "maven_command"]

# Written after the copy finishes: its absence means "resolve again" (an interrupted mvn run).
RESOLVED_MARKER = ".resolved"
OUTPUT_TAIL_LINES = 40


class MavenError(PurgatoryError):
    """Maven is missing, timed out or failed; the message says which, with its output's tail."""


def maven_command(pom: Path, into: Path, properties: Mapping[str, str], mvn: str = "mvn") -> list[str]:
    """The ``mvn dependency:copy-dependencies`` command copying ``pom``'s dependencies into ``into``."""
    return [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        *(f"-D{name}={value}" for name, value in properties.items()),
        f"-DoutputDirectory={into}",
    ]


def is_resolved(into: Path) -> bool:
    return (into / RESOLVED_MARKER).is_file()


def copy_dependencies(
    pom: Path, into: Path, properties: Mapping[str, str], *, expect: str, what: str, timeout_s: float
) -> Path:
    """Resolve ``pom`` into ``into`` once; return ``into``. ``expect`` is a glob that must match
    in the copy (the artifact asked for) for the resolution to count."""
    if is_resolved(into):
        return into
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(
            f"Maven ('mvn') is not on PATH: it is needed once to resolve {what} from Maven Central "
            f"into {into}"
        )
    into.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{into.name}-", dir=into.parent))
    command = maven_command(pom, staging, properties, mvn)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        raise MavenError(f"Maven did not resolve {what} within {timeout_s:.0f} s") from None
    if done.returncode != 0 or not any(staging.glob(expect)):
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-OUTPUT_TAIL_LINES:])
        raise MavenError(
            f"Maven could not resolve {what} (exit {done.returncode}):\n{tail}\n"
            f"command: {shlex.join(command)}"
        )
    (staging / RESOLVED_MARKER).write_text(what)
    if into.is_dir() and not is_resolved(into):
        shutil.rmtree(into, ignore_errors=True)  # a half-filled copy from an older, manual run
    # Another process may have resolved the same version meanwhile: keep whichever landed first.
    try:
        staging.rename(into)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return into
