"""Scale-out on three brokers: service instances (subprocesses, loopback ports) split a topic's partitions.

Each instance joins the ownership group; a request sent to the wrong instance reaches the owner
(307, or forwarded); an instance SIGKILLed and one stopped gracefully while long polls and
produce-waits are pending lose nothing — every request is answered once (completed, expired, or
MOVED and then completed by the new owner within its deadline); a new instance joining takes
over partitions without dropping requests. session.timeout.ms is 6 s here, so a SIGKILLed
instance's partitions are reassigned within about that.

The test client is what a client of a scaled-out service does: it follows 307/303 (after
``Retry-After`` when the answer carries one), waits ``Retry-After`` on a 503 and retries at its
``Location`` on a live instance, and re-sends an idempotent GET elsewhere when its instance's
connection dies (a SIGKILLed process answers nothing). Every long poll and produce-wait here is
a GET: re-sending one appends nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest
from purgatory.adapters.kafka import LocalKafkaCluster
from purgatory.adapters.kafka.cli import app as kafka_cli
from purgatory.adapters.service.instances import Instance, LocalInstances
from typer.testing import CliRunner

from tests.kafka.kafka_fixtures import create_topic, wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 6
SESSION_TIMEOUT_MS = 6000
WAIT_MS = 30_000  # long polls and produce-waits: longer than a SIGKILL recovery (session timeout)
SLACK_S = 5.0  # an answer may come this long after the request's own deadline (redirect hops)
MAX_HOPS = 200  # redirects and retries per request: bounded
SETTLE_S = 40.0  # the group is stable with every partition assigned


@dataclass
class Answer:
    """The one final answer of a logical request, and the hops it took to get there."""

    name: str
    status: int
    body: dict[str, Any]
    hops: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


class Client:
    """A client of the scaled-out service (see the module docstring), over live instances."""

    def __init__(self, fleet: LocalInstances) -> None:
        self.fleet = fleet
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(WAIT_MS / 1000 + 10, connect=2.0))
        self._rotation = itertools.count()

    def any_url(self) -> str:
        running = self.fleet.running()
        assert running, "no instance is running"
        return running[next(self._rotation) % len(running)].url

    async def get(self, name: str, path: str, params: dict[str, Any], deadline_s: float) -> Answer:
        """GET ``path`` until a final answer (2xx/4xx/504): redirects, 503 retries, dead instances."""
        started = time.monotonic()
        end = started + deadline_s
        url = f"{self.any_url()}{path}?{urlencode(params)}"
        hops: list[str] = []
        for _ in range(MAX_HOPS):
            if time.monotonic() > end + SLACK_S:
                break
            try:
                response = await self.http.get(url)
            except httpx.TransportError as exc:  # the instance died under us: re-send elsewhere
                hops.append(f"transport:{type(exc).__name__}")
                await asyncio.sleep(0.2)
                url = self._elsewhere(url, started, deadline_s)
                continue
            body = response.json() if response.content else {}
            if response.status_code in (303, 307):
                hops.append(f"{response.status_code}{':MOVED' if body.get('outcome') == 'MOVED' else ''}")
                if "retry-after" in response.headers:
                    await asyncio.sleep(min(float(response.headers["retry-after"]), 1.0))
                url = response.headers["location"]
                continue
            if response.status_code == 503 and "retry-after" in response.headers:
                hops.append(f"503:{body.get('outcome') or body.get('error')}")
                await asyncio.sleep(float(response.headers["retry-after"]))
                location = response.headers.get("location")
                base = self.any_url()
                url = f"{base}{location}" if location else self._elsewhere(url, started, deadline_s)
                continue
            return Answer(name, response.status_code, body, hops, time.monotonic() - started)
        raise AssertionError(f"{name}: no final answer within its deadline; hops {hops}")

    def _elsewhere(self, url: str, started: float, deadline_s: float) -> str:
        """The same request at a live instance, its wait cut to what remains of its deadline."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        remaining_ms = max(0, int((started + deadline_s - time.monotonic()) * 1000))
        for wait in ("max_wait_ms", "timeout_ms"):
            if wait in query:
                query[wait] = str(remaining_ms)
        return f"{self.any_url()}{parts.path}?{urlencode(query)}"

    async def aclose(self) -> None:
        await self.http.aclose()


@pytest.fixture
def topic(kafka_cluster3: LocalKafkaCluster) -> str:
    name = f"scale-{uuid.uuid4().hex[:8]}"
    return create_topic(kafka_cluster3.bootstrap_servers, name, PARTITIONS, 3, {"min.insync.replicas": "2"})


@pytest.fixture
def fleet(kafka_cluster3: LocalKafkaCluster, topic: str, tmp_path: Path) -> Iterator[LocalInstances]:
    with LocalInstances(
        kafka_cluster3.bootstrap_servers,
        topics=[topic],
        group_id=f"g-{topic}",
        log_dir=tmp_path,
        session_timeout_ms=SESSION_TIMEOUT_MS,
    ) as instances:
        yield instances


def settled(
    fleet: LocalInstances, members: int, headers: dict[str, str] | None = None
) -> dict[str, list[int]]:
    """Wait until every running instance sees ``members`` members owning all partitions; url → partitions."""
    view: dict[str, list[int]] = {}

    def stable() -> bool:
        nonlocal view
        running = fleet.running()
        documents = [fleet.owners(i, headers) for i in running]
        views = []
        for document in documents:
            if document["state"] != "STABLE" or len(document["members"]) != members:
                return False
            views.append(
                {
                    m["url"]: sorted(int(p.rsplit("-", 1)[1]) for p in m["partitions"])
                    for m in document["members"]
                }
            )
            owned = sorted(int(p.rsplit("-", 1)[1]) for p in document["owned"])
            if views[-1].get(document["url"]) != owned:
                return False  # the describe is older than this member's own assignment
        view = views[0]
        return all(v == view for v in views) and sorted(itertools.chain(*view.values())) == list(
            range(PARTITIONS)
        )

    wait_until(stable, f"{members} members own all {PARTITIONS} partitions", SETTLE_S)
    return view


def produce(bootstrap: str, topic: str, values: dict[int, str]) -> dict[int, int]:
    """Append one record per partition straight to Kafka (acks=all); partition → its offset."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    offsets: dict[int, int] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        offsets[message.partition()] = message.offset()

    for partition, value in values.items():
        producer.produce(topic, value.encode(), partition=partition, on_delivery=delivered)
    assert producer.flush(30) == 0, "every record acknowledged"
    return offsets


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex[:6]}"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def owner_of(view: dict[str, list[int]], partition: int) -> str:
    return next(url for url, parts in view.items() if partition in parts)


# -- wrong instance ----------------------------------------------------------------------------


async def test_requests_to_the_wrong_instance_reach_the_owner(
    kafka_cluster3: LocalKafkaCluster, fleet: LocalInstances, topic: str
) -> None:
    instances = [fleet.start() for _ in range(3)]
    view = settled(fleet, 3)
    assert all(len(parts) == 2 for parts in view.values()), f"6 partitions split 2/2/2: {view}"
    async with httpx.AsyncClient(timeout=20.0) as http:
        for partition in range(PARTITIONS):
            owner = owner_of(view, partition)
            wrong = next(i for i in instances if i.url != owner)
            path = f"/topics/{topic}/partitions/{partition}/records"
            redirected = await http.get(f"{wrong.url}{path}", params={"offset": 0, "max_wait_ms": 100})
            assert redirected.status_code == 307, redirected.text
            assert redirected.headers["location"].startswith(f"{owner}{path}?"), (
                "307 to the owner, same query"
            )
            served = await http.get(redirected.headers["location"])
            assert served.status_code == 200 and served.json()["outcome"] == "EXPIRED", served.text
        # A produce does not depend on ownership: any instance produces to any partition (acks=all
        # is answered by the partition's leader), appended once.
        owner = owner_of(view, 0)
        wrong = next(i for i in instances if i.url != owner)
        body = {"records": [{"value": "once", "partition": 0}], "timeout_ms": 10_000}
        done = await http.post(f"{wrong.url}/topics/{topic}/records", json=body)
        assert done.status_code == 200 and done.json()["statuses"] == {"0": "NONE"}, done.text
        assert end_offsets(kafka_cluster3.bootstrap_servers, topic)[0] == 1, "appended once"
        owners = (await http.get(f"{wrong.url}/owners")).json()
        assert {m["url"] for m in owners["members"]} == {i.url for i in instances}, (
            "client.id carries the URL"
        )
        metrics = (await http.get(f"{wrong.url}/metrics")).text
        assert "purgatory_ownership_partitions_owned 2.0" in metrics
        assert 'purgatory_service_misdirected_requests_total{answer="redirect"}' in metrics
    # A keyed record lands where librdkafka's default partitioner would put it (the service
    # decides partitions itself in scale-out mode, to know the owner before appending).
    from confluent_kafka import Producer

    keys = ("alpha", "beta", "gamma", "delta")
    landed: dict[str, int] = {}  # delivery reports of different partitions come in any order
    producer = Producer({"bootstrap.servers": kafka_cluster3.bootstrap_servers})
    for key in keys:
        producer.produce(
            topic,
            b"k",
            key.encode(),
            on_delivery=lambda e, m: landed.update({m.key().decode(): m.partition()}),
        )
    assert producer.flush(30) == 0
    assert landed == {k: zlib.crc32(k.encode()) % PARTITIONS for k in keys}, "librdkafka: CRC32(key) % count"
    async with httpx.AsyncClient(timeout=20.0, follow_redirects=True) as http:
        for key in keys:
            keyed = {"records": [{"value": "k", "key": key}], "timeout_ms": 10_000}
            answer = await http.post(f"{instances[0].url}/topics/{topic}/records", json=keyed)
            assert answer.status_code == 200 and list(answer.json()["offsets"]) == [str(landed[key])], (
                answer.text
            )
    # The same assignment from outside the service: `purgatory kafka owners` asks Kafka itself.
    shown = CliRunner().invoke(
        kafka_cli,
        ["owners", "--group", f"g-{topic}", "--bootstrap", kafka_cluster3.bootstrap_servers, "--json"],
    )
    assert shown.exit_code == 0, shown.output
    described = json.loads(shown.output)
    assert described["state"] == "STABLE"
    assert {
        m["url"]: sorted(int(p.rsplit("-", 1)[1]) for p in m["partitions"]) for m in described["members"]
    } == view


async def test_forward_mode_answers_from_the_owner_without_a_redirect(
    fleet: LocalInstances, topic: str
) -> None:
    forward = {"PURGATORY_SCALEOUT__MODE": "forward"}
    instances = [fleet.start(forward) for _ in range(2)]
    view = settled(fleet, 2)
    async with httpx.AsyncClient(timeout=20.0) as http:
        for partition in range(PARTITIONS):
            wrong = next(i for i in instances if i.url != owner_of(view, partition))
            answer = await http.get(
                f"{wrong.url}/topics/{topic}/partitions/{partition}/records",
                params={"offset": 0, "max_wait_ms": 50},
            )
            assert answer.status_code == 200 and answer.json()["partition"] == partition, answer.text
        metrics = (await http.get(f"{instances[0].url}/metrics")).text
        assert 'purgatory_service_misdirected_requests_total{answer="forward"} 3.0' in metrics, metrics


async def test_forward_mode_passes_the_clients_bearer_token_to_the_owner(
    fleet: LocalInstances, topic: str
) -> None:
    """With auth on, a forwarded request once reached the owner without its Authorization
    header: the owner answered 401 to a client the first instance had authenticated."""
    token = "forwarded-token-1234"
    env = {"PURGATORY_SCALEOUT__MODE": "forward", "PURGATORY_SERVICE__AUTH_TOKENS": json.dumps([token])}
    instances = [fleet.start(env) for _ in range(2)]
    bearer = {"Authorization": f"Bearer {token}"}
    view = settled(fleet, 2, bearer)
    async with httpx.AsyncClient(timeout=20.0) as http:
        for partition in range(PARTITIONS):
            wrong = next(i for i in instances if i.url != owner_of(view, partition))
            url = f"{wrong.url}/topics/{topic}/partitions/{partition}/records"
            params = {"offset": 0, "max_wait_ms": 50}
            answer = await http.get(url, params=params, headers=bearer)
            assert answer.status_code == 200 and answer.json()["partition"] == partition, answer.text
            refused = await http.get(url, params=params, headers={"Authorization": "Bearer wrong-token"})
            assert refused.status_code == 401, "a wrong token is refused before any forward"
        metrics = (await http.get(f"{instances[0].url}/metrics", headers=bearer)).text
        assert 'purgatory_service_misdirected_requests_total{answer="forward"} 3.0' in metrics, metrics


# -- failures while requests wait --------------------------------------------------------------


async def _pending(client: Client, topic: str, base: dict[int, int], tag: str) -> list[asyncio.Task[Answer]]:
    """A long poll (next record) and a produce-wait (next record replicated) per partition."""
    tasks = []
    for partition in range(PARTITIONS):
        fetch = {"offset": base[partition], "max_wait_ms": WAIT_MS}
        tasks.append(
            asyncio.ensure_future(
                client.get(
                    f"{tag}-fetch-{partition}",
                    f"/topics/{topic}/partitions/{partition}/records",
                    fetch,
                    WAIT_MS / 1000,
                )
            )
        )
        wait = {"offsets": f"{partition}:{base[partition]}", "timeout_ms": WAIT_MS}
        tasks.append(
            asyncio.ensure_future(
                client.get(
                    f"{tag}-replicated-{partition}", f"/topics/{topic}/replicated", wait, WAIT_MS / 1000
                )
            )
        )
    return tasks


async def _until_waiting(fleet: LocalInstances, count: int) -> None:
    """Until the running instances hold ``count`` operations between them (each request is in a purgatory)."""
    deadline = time.monotonic() + 20
    async with httpx.AsyncClient(timeout=5.0) as http:
        while True:
            held = 0
            for instance in fleet.running():
                health = (await http.get(f"{instance.url}/healthz")).json()
                held += sum(p["NumDelayedOperations"] for p in health["purgatories"].values())
            if held >= count:
                return
            assert time.monotonic() < deadline, f"only {held} of {count} requests are waiting"
            await asyncio.sleep(0.05)


def _check(answers: list[Answer], base: dict[int, int], values: dict[int, str]) -> None:
    names = [a.name for a in answers]
    assert len(names) == len(set(names)), "each request answered exactly once"
    for answer in answers:
        partition = int(answer.name.rsplit("-", 1)[1])
        assert answer.status == 200, f"{answer.name}: {answer.status} {answer.body} after {answer.hops}"
        assert answer.elapsed_s < WAIT_MS / 1000 + SLACK_S, (
            f"{answer.name} answered late: {answer.elapsed_s:.1f} s"
        )
        if "-fetch-" in answer.name:
            records = answer.body["records"]
            assert answer.body["outcome"] == "COMPLETED" and records, (
                f"{answer.name}: {answer.body} {answer.hops}"
            )
            assert records[0]["offset"] == base[partition] and records[0]["value"] == values[partition]
        else:
            assert answer.body["statuses"] == {str(partition): "NONE"}, f"{answer.name}: {answer.body}"


async def test_sigkill_and_graceful_stop_lose_no_pending_request(
    kafka_cluster3: LocalKafkaCluster, fleet: LocalInstances, topic: str
) -> None:
    bootstrap = kafka_cluster3.bootstrap_servers
    instances = [fleet.start() for _ in range(3)]
    settled(fleet, 3)
    client = Client(fleet)
    try:
        base = end_offsets(bootstrap, topic)
        tasks = await _pending(client, topic, base, "p")
        await _until_waiting(fleet, 2 * PARTITIONS)
        killed, stopped = instances[0], instances[1]
        # Blocking calls run off the loop: the client's requests are served meanwhile.
        await asyncio.to_thread(fleet.kill, killed)  # connections die; reassigned after the session timeout
        exit_code = await asyncio.to_thread(
            fleet.stop, stopped
        )  # leaves the group: its waiters MOVED at once
        # uvicorn re-raises the SIGTERM it handled once shut down: -15 is a graceful exit, -9 is not.
        assert exit_code in (0, -signal.SIGTERM), f"graceful stop, exit {exit_code}"
        survivor: Instance = instances[2]
        await asyncio.to_thread(settled, fleet, 1)
        assert len(fleet.owners(survivor)["owned"]) == PARTITIONS, "the survivor owns every partition"
        await _until_waiting(fleet, 2 * PARTITIONS)  # every request waits again, at the survivor
        values = {p: f"v{p}-{uuid.uuid4().hex[:4]}" for p in range(PARTITIONS)}
        produce(bootstrap, topic, values)
        answers = list(await asyncio.gather(*tasks))
    finally:
        await client.aclose()
    _check(answers, base, values)
    assert any("MOVED" in h for a in answers for h in a.hops), "the graceful stop answered its waiters MOVED"
    assert any(h.startswith("transport") for a in answers for h in a.hops), "the SIGKILL cut some requests"


async def test_a_joining_instance_takes_over_partitions_without_dropping_requests(
    kafka_cluster3: LocalKafkaCluster, fleet: LocalInstances, topic: str
) -> None:
    bootstrap = kafka_cluster3.bootstrap_servers
    first = fleet.start()
    settled(fleet, 1)
    client = Client(fleet)
    try:
        base = end_offsets(bootstrap, topic)
        tasks = await _pending(client, topic, base, "j")
        await _until_waiting(fleet, 2 * PARTITIONS)
        joined = await asyncio.to_thread(fleet.start)
        view = await asyncio.to_thread(settled, fleet, 2)
        assert view[joined.url] and view[first.url], f"the new instance took a share: {view}"
        await _until_waiting(fleet, 2 * PARTITIONS)
        values = {p: f"j{p}-{uuid.uuid4().hex[:4]}" for p in range(PARTITIONS)}
        produce(bootstrap, topic, values)
        answers = list(await asyncio.gather(*tasks))
    finally:
        await client.aclose()
    _check(answers, base, values)
    moved = {int(a.name.rsplit("-", 1)[1]) for a in answers if any("MOVED" in h for h in a.hops)}
    assert moved == set(view[joined.url]), "exactly the requests of the partitions that moved were MOVED"


# -- cluster load ------------------------------------------------------------------------------


def test_the_cluster_is_asked_about_each_partition_once_not_once_per_instance(
    kafka_bootstrap: str, kafka_topic_factory: Any
) -> None:
    """The bench's measurement on a small run: with scale-out two instances split the partitions
    they poll; without, each polls every partition it was asked about (figures: purgatory bench scaleout)."""
    from purgatory.tools.bench.service.scaleout import measure_side

    topic = kafka_topic_factory(4, prefix="load")
    split = measure_side(kafka_bootstrap, topic, "scaleout", 2, 4, 2, 3.0)  # > 1 s: librdkafka stats
    assert sorted(split.watched_partitions) == [2, 2], "each partition polled by its owner only"
    assert split.ownership_requests_per_s > 0, "the group's own requests are counted"
    alone = measure_side(kafka_bootstrap, topic, "alone", 2, 4, 2, 1.0)
    assert alone.watched_partitions == [4, 4], "without scale-out every instance polls every partition"
