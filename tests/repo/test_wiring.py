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
PROVIDER = ROOT / "adapters" / "kafka" / "clients" / "_provider.py"


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
        "name the cluster through configured_bootstrap() (adapters/kafka/clients/_provider.py), "
        f"the one place of the provider order: {sorted(map(str, readers))}"
    )


# Fixtures and classes that start a cluster of a test's own: a service built next to one must be
# told that cluster explicitly, because the bootstrap order above puts PURGATORY_KAFKA_BOOTSTRAP
# (the user's exported cluster) above settings — it would silently serve the user's cluster
# while the test stops brokers of its own.
OWN_CLUSTER_NAMES = {"LocalKafkaCluster", "kafka_cluster1", "kafka_cluster3", "fault_cluster"}
SERVICE_BUILDERS = {"create_app", "Gateway"}


def _services_built_without_a_cluster(source: str, where: str) -> list[str]:
    """``create_app(...)``/``Gateway(...)`` calls without ``bootstrap_servers`` in a module that
    starts a cluster of its own (names one of OWN_CLUSTER_NAMES)."""
    tree = ast.parse(source, where)
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)
    }
    if not names & OWN_CLUSTER_NAMES:
        return []
    return [
        f"{where}:{node.lineno} {name}(...)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (name := _called_name(node)) in SERVICE_BUILDERS
        and not any(keyword.arg == "bootstrap_servers" for keyword in node.keywords)
        and len(node.args) < 2  # create_app(settings, servers) / Gateway(settings, servers)
    ]


def test_a_service_next_to_a_tests_own_cluster_is_told_that_cluster() -> None:
    unnamed = [
        found
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        for found in _services_built_without_a_cluster(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert unnamed == [], (
        "pass bootstrap_servers=<the test's cluster>: PURGATORY_KAFKA_BOOTSTRAP would win over "
        f"settings and the service would talk to the user's cluster: {unnamed}"
    )


def test_the_own_cluster_check_catches_a_service_built_from_settings_alone() -> None:
    old = (
        "def test_x(kafka_cluster1: LocalKafkaCluster) -> None:\n"
        "    kafka = KafkaSettings(bootstrap_servers=kafka_cluster1.bootstrap_servers)\n"
        "    app = create_app(Settings(kafka=kafka))\n"
        "    ok = create_app(Settings(kafka=kafka), bootstrap_servers=kafka.bootstrap_servers)\n"
    )
    assert _services_built_without_a_cluster(old, "old") == ["old:3 create_app(...)"]
    shared = "def test_y(kafka_settings):\n    create_app(Settings(kafka=kafka_settings))\n"
    assert _services_built_without_a_cluster(shared, "shared") == [], "the session cluster is the user's own"
