"""The README's main job behind ``purgatory run`` — Kafka, the example service, and a short exercise of it.

Steps, each bounded in time:

1. **Kafka.** The configured cluster (``PURGATORY_KAFKA__BOOTSTRAP_SERVERS`` or
   ``PURGATORY_KAFKA_BOOTSTRAP``); with none configured, a local Apache Kafka started by the
   Kafka adapter's launcher on 127.0.0.1 (provider order of docs/design.md §5).
2. **Topic.** A fresh topic with three partitions (replication factor up to 3, min.insync up to 2).
3. **Service.** The example service on uvicorn, 127.0.0.1, a kernel-chosen port.
4. **Exercise** with a real HTTP client: long polls on partitions 0 and 1 that a produced record
   completes, long polls on partition 2 that expire, one produce-and-wait-until-replicated, and a
   request for an unknown topic (a 404 naming the field). Every poll must be waiting in the fetch
   purgatory (``/healthz``) before the records are produced.
5. **Report** a table of what happened and the purgatory metrics from ``/metrics``; stop the
   service, delete the topic from a cluster we did not start, stop a cluster we did start (by PID).
   Exit 0 iff every request ended as expected.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from rich.console import Console
from rich.table import Table

from purgatory.settings import ConfigError, Settings, load_settings

from ...kafka import (
    KafkaAdapterError,
    KafkaClusterHandle,
    client_config,
    configured_bootstrap,
    provide_cluster,
)
from ..app._app import create_app
from ._server import BackgroundServer

__all__ = ["Expectation", "main"]

_log = structlog.get_logger("purgatory.run")

PARTITIONS = 3  # 0 and 1: polls completed by records; 2: polls left to expire
TOPIC_TIMEOUT_S = 30.0  # create a topic and see every partition led
EXERCISE_TIMEOUT_S = 60.0  # the whole HTTP exercise (its longest wait is a 10 s long poll)
COMPLETED_POLL_WAIT_MS = 10_000  # long enough that only a record can answer these polls
EXPIRING_POLL_WAITS_MS = (300, 800)  # short: these must expire, and quickly
PRODUCE_TIMEOUT_MS = 10_000
CONSOLE_WIDTH = 110  # not a terminal (CI logs): wide enough that the table's rows stay on one line
POLL_S = 0.02  # waiting for "N polls pending" polls /healthz: the server has no event to push


@dataclass
class Expectation:
    """One request of the exercise: what it asked, what it should end as, and what it did."""

    request: str
    expected: str
    status: int | None = None
    outcome: str | None = None
    records: int = 0
    latency_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == self.expected


def _create_topic(bootstrap: str, settings: Settings) -> tuple[str, int]:
    """A fresh topic with PARTITIONS partitions, replicated up to 3; returns (name, replication)."""
    admin = AdminClient({**client_config(settings.kafka, bootstrap), "log_level": "0"})
    brokers = len(admin.list_topics(timeout=TOPIC_TIMEOUT_S).brokers)
    replication = min(3, brokers)
    name = f"purgatory-run-{uuid.uuid4().hex[:8]}"
    config = {"min.insync.replicas": str(min(2, replication))}
    futures = admin.create_topics([NewTopic(name, PARTITIONS, replication, config=config)])
    futures[name].result(timeout=TOPIC_TIMEOUT_S)
    deadline = time.monotonic() + TOPIC_TIMEOUT_S
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        if (
            topic is not None
            and len(topic.partitions) == PARTITIONS
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return name, replication
        time.sleep(0.05)  # leader election has no client-side event to wait on
    raise KafkaAdapterError(f"topic {name} has no leaders after {TOPIC_TIMEOUT_S:.0f} s")


def _delete_topic(bootstrap: str, settings: Settings, name: str) -> None:
    admin = AdminClient({**client_config(settings.kafka, bootstrap), "log_level": "0"})
    admin.delete_topics([name])[name].result(timeout=TOPIC_TIMEOUT_S)


async def _timed(client: httpx.AsyncClient, row: Expectation, method: str, url: str, **kw: Any) -> None:
    started = time.monotonic()
    response = await client.request(method, url, **kw)
    row.latency_ms = (time.monotonic() - started) * 1000.0
    row.status = response.status_code
    body = response.json()
    if response.status_code == 200 and method == "POST":
        # acks=all: 200 means every record is on each in-sync replica.
        row.outcome = "REPLICATED" if set(body["statuses"].values()) == {"NONE"} else str(body["statuses"])
        row.records = sum(1 for r in body["records"] if r["status"] == "NONE")
    elif response.status_code == 200:
        row.outcome = body["outcome"]
        row.records = len(body["records"])
    else:
        row.outcome = f"{response.status_code} field={body.get('field')}"


async def _pending_fetches(client: httpx.AsyncClient) -> int:
    health = (await client.get("/healthz")).json()
    # Waiting requests: equal long polls share one operation of the fetch purgatory (issue 30).
    return int(health.get("long_poll_waiters", health["purgatories"]["fetch"]["NumDelayedOperations"]))


async def _exercise(url: str, topic: str) -> tuple[list[Expectation], str]:
    rows: list[Expectation] = []
    async with httpx.AsyncClient(base_url=url, timeout=EXERCISE_TIMEOUT_S) as client:
        records = f"/topics/{topic}/partitions/{{}}/records"
        polls = []
        for partition, extra in ((0, {}), (1, {}), (0, {"min_records": 2})):
            what = " ".join(f"{k}={v}" for k, v in extra.items()) or "long poll"
            row = Expectation(f"GET p{partition} {what}", "COMPLETED")
            params = {"offset": 0, "max_wait_ms": COMPLETED_POLL_WAIT_MS, **extra}
            polls.append(_timed(client, row, "GET", records.format(partition), params=params))
            rows.append(row)
        for wait_ms in EXPIRING_POLL_WAITS_MS:
            row = Expectation(f"GET p2 max_wait_ms={wait_ms}", "EXPIRED")
            polls.append(
                _timed(client, row, "GET", records.format(2), params={"offset": 0, "max_wait_ms": wait_ms})
            )
            rows.append(row)
        tasks = [asyncio.create_task(p) for p in polls]
        deadline = time.monotonic() + EXERCISE_TIMEOUT_S
        while await _pending_fetches(client) < len(tasks) and not any(t.done() for t in tasks):
            if time.monotonic() > deadline:
                raise TimeoutError("the long polls never all waited in the fetch purgatory")
            await asyncio.sleep(POLL_S)
        produce = Expectation("POST 3 records (p0, p1), wait", "REPLICATED")
        body = {
            "records": [{"value": f"record-{p}-{i}", "partition": p} for p, i in ((0, 0), (0, 1), (1, 0))],
            "timeout_ms": PRODUCE_TIMEOUT_MS,
        }
        await _timed(client, produce, "POST", f"/topics/{topic}/records", json=body)
        await asyncio.gather(*tasks)
        unknown = Expectation("GET unknown topic", "404 field=topic")
        await _timed(client, unknown, "GET", "/topics/no-such-topic-run/partitions/0/records")
        rows += [produce, unknown]
        metrics = (await client.get("/metrics")).text
    return rows, metrics


def _report(console: Console, rows: list[Expectation], metrics: str) -> None:
    table = Table(title="purgatory run: the example service, exercised over HTTP")
    for column in ("request", "expected", "HTTP", "outcome", "records", "ms", "ok"):
        table.add_column(
            column, justify="right" if column in ("HTTP", "records", "ms") else "left", no_wrap=True
        )
    for row in rows:
        table.add_row(
            row.request,
            row.expected,
            str(row.status),
            row.outcome or "-",
            str(row.records),
            f"{row.latency_ms:.0f}",
            "[green]yes[/green]" if row.ok else "[red]NO[/red]",
        )
    console.print(table)
    wanted = ("Finished_total", "Expires_total", "NumDelayedOperations", "PurgatorySize")
    lines = [
        line.removeprefix("kafka_server_DelayedOperationPurgatory_")
        for line in metrics.splitlines()
        if line.startswith("kafka_server_DelayedOperationPurgatory_") and any(w in line for w in wanted)
    ]
    console.print("[bold]/metrics[/bold] (Kafka's purgatory metric names):")
    for line in lines:
        console.print(f"  {line}", highlight=False)


def main(brokers: int = 1) -> bool:
    """The whole job (see the module docstring); True iff every request ended as expected."""
    console = Console(width=CONSOLE_WIDTH) if not Console().is_terminal else Console()
    try:
        settings = load_settings()
    except ConfigError as exc:
        console.print(str(exc), highlight=False)
        return False
    started = time.monotonic()
    configured = configured_bootstrap(settings.kafka)
    try:
        # A configured cluster is used as it is; --brokers only shapes a local one we start.
        handle: KafkaClusterHandle = provide_cluster(settings.kafka, brokers=1 if configured else brokers)
    except KafkaAdapterError as exc:
        console.print(f"[red]could not start Kafka:[/red] {exc}")
        return False
    pids = [node.pid for node in handle.local.nodes.values()] if handle.local is not None else []
    console.print(
        f"Kafka ({handle.provider}): {handle.bootstrap_servers}"
        + (f", local broker PIDs {pids}" if pids else "")
        + f" [{time.monotonic() - started:.1f} s]"
    )
    ok = False
    topic: str | None = None
    try:
        topic, replication = _create_topic(handle.bootstrap_servers, settings)
        console.print(f"topic {topic}: {PARTITIONS} partitions, replication factor {replication}")
        app = create_app(settings, bootstrap_servers=handle.bootstrap_servers)
        with BackgroundServer(app) as server:
            console.print(f"service: {server.url}")
            rows, metrics = asyncio.run(asyncio.wait_for(_exercise(server.url, topic), EXERCISE_TIMEOUT_S))
        _report(console, rows, metrics)
        ok = all(row.ok for row in rows)
    except Exception as exc:  # Kafka, HTTP, timeouts, or a bug: still a verdict, still the cleanup
        console.print(f"[red]failed:[/red] {exc!r}", highlight=False)
        _log.exception("run_failed")
    finally:
        if topic is not None and handle.local is None:
            try:
                _delete_topic(handle.bootstrap_servers, settings, topic)
            except Exception as exc:  # cleanup must not hide the run's own result
                console.print(f"could not delete topic {topic}: {exc!r}")
        handle.stop()
        if pids:
            console.print(f"stopped local Kafka (PIDs {pids})")
    console.print(f"{'done' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
    return ok
