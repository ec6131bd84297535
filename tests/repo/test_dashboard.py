"""docker/grafana: every metric the shipped dashboard queries is one the service exports.

The dashboard's PromQL expressions are parsed for metric names (what is left once label
matchers, grouping clauses, ranges, strings, numbers and function calls are taken out); the
registry is the service's own (the purgatory collector and the service collector) after a few
operations, so a renamed or dropped metric fails here rather than as an empty panel.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from purgatory.adapters.kafka._metrics import AnswerCounts, KafkaCollector
from purgatory.adapters.kafka.facts._gathered import GatheredRecords
from purgatory.adapters.service.app._metrics import Answers, ServiceCollector

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.metrics import register_metrics
from purgatory.testing import MockTimer

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "docker"
DASHBOARD = DOCKER_DIR / "grafana" / "dashboards" / "purgatory.json"
PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def dashboard_expressions() -> list[str]:
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [target["expr"] for panel in document["panels"] for target in panel.get("targets", [])]
    assert exprs, "the dashboard queries something"
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors ([5m], [$__rate_interval])
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # grouping labels
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group()
        after = text[match.end() :].lstrip()
        if after.startswith("(") or name in PROMQL_KEYWORDS:
            continue  # a function or aggregation call, or a keyword
        names.add(name)
    return names


def test_metric_names_are_parsed_out_of_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, delayedOperation) "
        '(rate(purgatory_operation_duration_seconds_bucket{outcome="completed"}[$__rate_interval])))'
        " / on (instance) group_left max(up) + 1"
    )
    assert metric_names(expr) == {"purgatory_operation_duration_seconds_bucket", "up"}


class _Op(DelayedOperation):
    __slots__ = ("ready",)

    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.ready = False

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> None:
        pass


def _exposed_after_a_few_operations() -> set[str]:
    registry = CollectorRegistry()
    register_metrics(registry)
    answers = Answers()
    answers.count(200)
    answers.count(503, b'{"error": "NOT_ENOUGH_REPLICAS"}')
    gateway: Any = SimpleNamespace(
        reader=SimpleNamespace(kafka_reads=1, shared_hits=0, cached_bytes=0, gathered=GatheredRecords(1)),
        feed=SimpleNamespace(
            stats=SimpleNamespace(polls=3, failures=1, last_success=time.monotonic()),
            unavailable=None,
            watched_keys=frozenset,
        ),
        view=SimpleNamespace(requests_sent=3),
        task_free_fetches=0,
        long_poll_waiters=0,
    )
    registry.register(ServiceCollector(lambda: gateway, answers))
    kafka_answers = AnswerCounts()
    kafka_answers.count("DelayedProduce", "NONE")
    kafka_answers.count("DelayedProduce", "UNKNOWN_TOPIC_OR_PARTITION")
    registry.register(KafkaCollector(kafka_answers, lambda: [("kafka", gateway.feed)]))
    timer = MockTimer()
    purgatory: DelayedOperationPurgatory[_Op] = DelayedOperationPurgatory(
        "fetch", timer=timer, reaper_enabled=False
    )
    try:
        done, waiting = _Op(1000), _Op(10)
        purgatory.try_complete_else_watch(done, ["k"])
        purgatory.try_complete_else_watch(waiting, ["k"])
        done.ready = True
        purgatory.check_and_complete("k")
        timer.advance_clock(10)
        return {sample.name for family in registry.collect() for sample in family.samples}
    finally:
        purgatory.shutdown()


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    exposed = _exposed_after_a_few_operations()
    queried = set().union(*(metric_names(expr) for expr in dashboard_expressions()))
    missing = sorted(queried - exposed)
    assert not missing, f"the dashboard queries metrics nothing exports: {missing}"


def test_grafana_reads_the_dashboard_from_prometheus_scraping_every_instance() -> None:
    compose = yaml.safe_load((DOCKER_DIR / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    prometheus = yaml.safe_load((DOCKER_DIR / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    instances = {
        name
        for name, service in services.items()
        if "purgatory.adapters.service.serve" in str(service.get("command"))
    }
    assert instances and targets == {f"{name}:8080" for name in instances}, (
        "every service instance is scraped"
    )
    mounts = " ".join(services["grafana"]["volumes"])
    assert "./grafana/dashboards:" in mounts and "./grafana/provisioning:" in mounts
    datasource = yaml.safe_load(
        (DOCKER_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text(
            encoding="utf-8"
        )
    )
    uids = {source["uid"] for source in datasource["datasources"]}
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    used = {panel["datasource"]["uid"] for panel in document["panels"]}
    assert used <= uids, f"panels name datasources Grafana is not given: {used - uids}"
