"""``purgatory bench scaleout``: cluster load of 1, 2, 3 service instances watching the same partitions.

Each run starts N instances of the service (subprocesses on loopback, :class:`LocalInstances`)
and holds long polls on every partition of one topic, sent to the instances in turn — what a
load balancer without sticky sessions does. Two sides, measured in the same run:

* ``scaleout``: the instances split the partitions through the ownership group; a long poll sent
  to a non-owner is redirected (307) to the owner, so each partition is watched by one instance.
* ``alone``: scale-out off; every instance watches every partition it was asked about.

Over a fixed window the bench reads each instance's ``/metrics``: the change feed's requests
(``purgatory_service_kafka_requests_total``, batched: one ListOffsets per poll whatever the
number of partitions), the partitions each poll asks about
(``purgatory_service_watched_partitions``), and the ownership's own requests (the group
consumer's heartbeats/joins/metadata from librdkafka's statistics, plus DescribeConsumerGroups).
"Partition lookups/s" — polls/s x partitions asked per poll, summed over instances — is the
cluster work that grows with instances x partitions without scale-out and with partitions only
with it. Medians of ``--repeats`` runs; the machine may be shared (noisy).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from prometheus_client.parser import text_string_to_metric_families
from purgatory.adapters.kafka import provide_cluster
from purgatory.adapters.service.instances import Instance, LocalInstances

from purgatory.settings import load_settings

__all__ = ["Sample", "measure_side", "scaleout"]

WAIT_MS = 60_000  # the long polls outlive the measured window: nothing completes, nothing re-polls
SETTLE_S = 60.0
HOLD_TIMEOUT_S = 60.0


@dataclass
class Sample:
    side: str
    instances: int
    feed_requests_per_s: float
    ownership_requests_per_s: float
    partition_lookups_per_s: float
    watched_partitions: list[int]

    @property
    def requests_per_s(self) -> float:
        return self.feed_requests_per_s + self.ownership_requests_per_s


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = sample.value
    return out


def _settle(fleet: LocalInstances, members: int, partitions: int) -> None:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        documents = [fleet.owners(i) for i in fleet.running()]
        if all(
            d["state"] == "STABLE"
            and len(d["members"]) == members
            and sum(len(m["partitions"]) for m in d["members"]) == partitions
            for d in documents
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the group did not settle with {members} members within {SETTLE_S:.0f} s")


async def _hold(
    instances: list[Instance], topic: str, partitions: int, per_partition: int
) -> list[asyncio.Task[Any]]:
    client = httpx.AsyncClient(timeout=WAIT_MS / 1000 + 10, follow_redirects=True)
    ends = {}
    for p in range(partitions):  # offset = the end: only new records would complete them
        probe = await client.get(
            f"{instances[0].url}/topics/{topic}/partitions/{p}/records", params={"max_wait_ms": 0}
        )
        ends[p] = probe.json()["next_offset"] if probe.status_code == 200 else 0
    tasks: list[asyncio.Task[Any]] = []
    for i in range(partitions * per_partition):
        # Round i of the partitions goes to instance i // partitions: each partition is asked of
        # every instance in turn (a load balancer knows nothing of partitions).
        p, instance = i % partitions, instances[(i // partitions) % len(instances)]
        url = f"{instance.url}/topics/{topic}/partitions/{p}/records"
        tasks.append(
            asyncio.ensure_future(client.get(url, params={"offset": ends[p], "max_wait_ms": WAIT_MS}))
        )
    total = len(tasks)
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    while True:
        held = 0
        for instance in instances:
            health = (await client.get(f"{instance.url}/healthz")).json()
            held += sum(p["NumDelayedOperations"] for p in health["purgatories"].values())
        if held >= total:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {held} of {total} long polls are waiting")
        await asyncio.sleep(0.1)
    tasks.append(asyncio.ensure_future(_close_later(client)))
    return tasks


async def _close_later(client: httpx.AsyncClient) -> None:
    try:
        await asyncio.sleep(WAIT_MS)
    finally:
        await client.aclose()


def _measure(
    fleet: LocalInstances, side: str, topic: str, partitions: int, per_partition: int, duration_s: float
) -> Sample:
    instances = fleet.running()

    async def run() -> Sample:
        tasks = await _hold(instances, topic, partitions, per_partition)
        try:
            before = [await asyncio.to_thread(_metrics, i.url) for i in instances]
            t0 = time.monotonic()
            await asyncio.sleep(duration_s)
            after = [await asyncio.to_thread(_metrics, i.url) for i in instances]
            elapsed = time.monotonic() - t0
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        def rate(name: str) -> float:
            return (
                sum(a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True)) / elapsed
            )

        lookups = sum(
            (a["purgatory_service_feed_polls_total"] - b["purgatory_service_feed_polls_total"])
            * a["purgatory_service_watched_partitions"]
            for a, b in zip(after, before, strict=True)
        )
        return Sample(
            side,
            len(instances),
            rate("purgatory_service_kafka_requests_total"),
            rate("purgatory_ownership_consumer_requests_total") + rate("purgatory_ownership_describes_total"),
            lookups / elapsed,
            [int(a["purgatory_service_watched_partitions"]) for a in after],
        )

    return asyncio.run(run())


def measure_side(
    bootstrap: str,
    topic: str,
    side: str,
    instances: int,
    partitions: int,
    per_partition: int,
    duration_s: float,
) -> Sample:
    """One run: ``instances`` instances (``side``: "scaleout" or "alone") holding long polls on ``topic``."""
    env = {} if side == "scaleout" else {"PURGATORY_SCALEOUT__ENABLED": "false"}
    group = f"bench-{uuid.uuid4().hex[:8]}"
    with LocalInstances(bootstrap, topics=[topic], group_id=group, env=env) as fleet:
        for _ in range(instances):
            fleet.start()
        if side == "scaleout":
            _settle(fleet, instances, partitions)
        return _measure(fleet, side, topic, partitions, per_partition, duration_s)


def scaleout(
    partitions: Annotated[int, typer.Option(help="Partitions of the watched topic.")] = 12,
    per_partition: Annotated[int, typer.Option(help="Long polls held per partition.")] = 6,
    duration: Annotated[float, typer.Option(help="Measured seconds per run.")] = 10.0,
    repeats: Annotated[int, typer.Option(help="Runs per configuration; medians are reported.")] = 3,
    max_instances: Annotated[
        int, typer.Option("--instances", min=1, max=5, help="Up to this many instances.")
    ] = 3,
    out: Annotated[Path, typer.Option(help="Directory of the JSON results.")] = Path("bench-results"),
) -> None:
    """Requests and partition lookups per second on the cluster, with and without scale-out."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    settings = load_settings().kafka
    samples: list[Sample] = []
    with provide_cluster(settings) as cluster:
        bootstrap = cluster.bootstrap_servers
        typer.echo(
            f"Kafka via {cluster.provider} at {bootstrap}; {partitions} partitions, "
            f"{per_partition} long polls each; feed interval {settings.feed_interval_ms} ms; "
            f"{duration:.0f} s windows; {repeats} repeats"
        )
        topic = f"bench-scaleout-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for future in admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=30).values():
            future.result(timeout=30)
        try:
            for repeat in range(repeats):
                for n in range(1, max_instances + 1):
                    # Alternate which side runs first: drift on a shared machine hits both alike.
                    sides = ("scaleout", "alone") if (repeat + n) % 2 == 0 else ("alone", "scaleout")
                    for side in sides:
                        sample = measure_side(bootstrap, topic, side, n, partitions, per_partition, duration)
                        samples.append(sample)
                        typer.echo(
                            f"  run {repeat + 1} {side:>8} x{n}: {sample.requests_per_s:7.1f} req/s, "
                            f"{sample.partition_lookups_per_s:8.0f} partition lookups/s, "
                            f"watched per instance {sample.watched_partitions}"
                        )
        finally:
            for future in admin.delete_topics([topic], request_timeout=30).values():
                future.result(timeout=30)
    typer.echo(
        f"\n{'instances':>9} {'side':>9} {'req/s':>8} {'feed':>7} {'ownership':>9} "
        f"{'lookups/s':>10} {'vs 1':>6}"
    )
    medians: dict[tuple[str, int], dict[str, float]] = {}
    for side in ("scaleout", "alone"):
        for n in range(1, max_instances + 1):
            runs = [s for s in samples if s.side == side and s.instances == n]
            medians[(side, n)] = {
                "requests_per_s": statistics.median(s.requests_per_s for s in runs),
                "feed_requests_per_s": statistics.median(s.feed_requests_per_s for s in runs),
                "ownership_requests_per_s": statistics.median(s.ownership_requests_per_s for s in runs),
                "partition_lookups_per_s": statistics.median(s.partition_lookups_per_s for s in runs),
            }
    for n in range(1, max_instances + 1):
        for side in ("scaleout", "alone"):
            m = medians[(side, n)]
            ratio = m["partition_lookups_per_s"] / max(medians[(side, 1)]["partition_lookups_per_s"], 1e-9)
            typer.echo(
                f"{n:>9} {side:>9} {m['requests_per_s']:>8.1f} {m['feed_requests_per_s']:>7.1f} "
                f"{m['ownership_requests_per_s']:>9.1f} {m['partition_lookups_per_s']:>10.0f} {ratio:>5.2f}x"
            )
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scaleout-{time.strftime('%Y%m%dT%H%M%S')}.json"
    document = {
        "options": {
            "partitions": partitions,
            "per_partition": per_partition,
            "duration_s": duration,
            "repeats": repeats,
        },
        "samples": [asdict(s) for s in samples],
        "medians": {f"{side}-{n}": m for (side, n), m in medians.items()},
    }
    path.write_text(json.dumps(document, indent=2))
    typer.echo(f"results: {path}")
