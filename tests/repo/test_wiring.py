"""One wiring of Kafka: the HTTP service builds on KafkaPurgatory, and one function says which
cluster is meant.

Read with ``ast`` like the layering check (nothing is imported): a gateway that built its own
view, feed, clients or purgatories again, or a module repeating the bootstrap order, fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "adapters" / "service"
# What KafkaPurgatory.connect builds: constructing one of these in the service is a second wiring.
KAFKA_WIRING = {
    "ClusterView",
    "ChangeFeed",
    "RecordProducer",
    "RecordReader",
    "SharedReadReader",
    "FencedAppender",
    "PartitionTail",
    "DelayedOperationPurgatory",
    "build_journal",
}
BOOTSTRAP_ENV = "PURGATORY_KAFKA_BOOTSTRAP"
PROVIDER = ROOT / "adapters" / "kafka" / "_provider.py"


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "from_settings":
        func = func.value  # DelayedOperationPurgatory.from_settings(...) builds one too
    if isinstance(func, ast.Subscript):
        func = func.value  # DelayedOperationPurgatory[DelayedFetch](...)
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _constructions(source: str, where: str) -> list[str]:
    return [
        f"{where}:{node.lineno} {name}(...)"
        for node in ast.walk(ast.parse(source, where))
        if isinstance(node, ast.Call) and (name := _called_name(node)) in KAFKA_WIRING
    ]


def _names_bootstrap_env(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "BOOTSTRAP_ENV") or (
        isinstance(node, ast.Constant) and node.value == BOOTSTRAP_ENV
    )


def _bootstrap_env_reads(path: Path) -> list[str]:
    """``environ.get(BOOTSTRAP_ENV)``, ``getenv(...)`` and ``environ[BOOTSTRAP_ENV]`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        read = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "getenv")
            and bool(node.args)
            and _names_bootstrap_env(node.args[0])
        ) or (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "environ"
            and _names_bootstrap_env(node.slice)
        )
        if read:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_service_builds_no_kafka_client_feed_or_purgatory_of_its_own() -> None:
    built = [
        found
        for path in sorted(SERVICE.rglob("*.py"))
        for found in _constructions(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert built == [], f"the service must get these from its KafkaPurgatory: {built}"


def test_the_wiring_check_catches_the_gateways_old_constructor() -> None:
    old = (
        "self.view = ClusterView(kafka, bootstrap_servers=self.bootstrap_servers)\n"
        "self.feed = ChangeFeed(self.view, settings=kafka, name='service', records=self.reader)\n"
        "self.fetch_purgatory = DelayedOperationPurgatory.from_settings(FETCH_PURGATORY, settings)\n"
    )
    assert _constructions(old, "old") == [
        "old:1 ClusterView(...)",
        "old:2 ChangeFeed(...)",
        "old:3 DelayedOperationPurgatory(...)",
    ]


def test_only_the_provider_reads_the_bootstrap_variable() -> None:
    readers = {
        path.relative_to(ROOT)
        for top in ("adapters", "tools")
        for path in sorted((ROOT / top).rglob("*.py"))
        if _bootstrap_env_reads(path)
    }
    assert readers == {PROVIDER.relative_to(ROOT)}, (
        "name the cluster through configured_bootstrap() (adapters/kafka/_provider.py), "
        f"the one place of the provider order: {sorted(map(str, readers))}"
    )
