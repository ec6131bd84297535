"""``python -m purgatory.tools.bench.service.min_bytes_flood``: large-``min_bytes`` long polls vs the
service's RSS.

The attack of the memory-runaway report: N long polls
``GET /topics/{t}/partitions/0/records?offset=E&min_bytes=16000000&max_bytes=16777216`` on one
partition (E: its end), then R records of B bytes produced to it through the service in batches
of K. Each waiter gathers toward 16 MB; unfixed, each also ended up with its own rendered answer
and transport buffer of ~21 MB (base64), so RSS grew with waiters x bytes (3 GB within seconds at
N = 1,000, R = 200, B = 100 KB).

Set-up: a real Kafka (the project's launcher, or ``PURGATORY_KAFKA_BOOTSTRAP``), a fresh topic,
the service in its own process (``python -m purgatory.adapters.service.serve``). The client is
this process, in one of three modes: ``idle`` (HTTP/1.1, never reads its answers: the worst case
for a server that writes whole answers), ``read`` (HTTP/1.1, reads and discards them), ``h2``
(h2c, streams per connection, reads and discards them, giving flow-control windows back).

Measured: the service's RSS every 50 ms (start, peak above start, at the end), ``/healthz``
every 250 ms with a 2 s bound (failures, slowest), every produce's status, answers received.
The machine may be shared: past ``--rss-cap-mb`` above start the service is killed (by its PID)
and the run reported as failed, rather than let it take the machine's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from typing import cast

import httpx
from purgatory.adapters.kafka import provide_cluster
from purgatory.adapters.kafka.local import free_port

from purgatory.settings import load_settings

from ..measure import rss_bytes
from .fanout import ServiceProcess, long_polls_waiting
from .h2_client import open_h2_long_polls

__all__ = ["FloodResult", "flood", "main"]

RSS_SAMPLE_S = 0.05
HEALTH_EVERY_S = 0.25
HEALTH_TIMEOUT_S = 2.0  # /healthz slower than this counts as not answering
PRODUCE_TIMEOUT_S = 30.0
SETTLE_S = 3.0  # after the last produce (and again after the clients left): RSS keeps being sampled
MAX_WAIT_MS = 30_000  # the long polls' max_wait_ms (the service's default clamp)
STREAMS_PER_CONNECTION = 100  # h2 mode


@dataclass
class FloodResult:
    mode: str
    waiters: int
    registered: int
    records: int
    record_bytes: int
    rss_start_mb: float
    rss_peak_above_start_mb: float
    rss_end_above_start_mb: float
    produces_ok: int
    produces_failed: list[str] = field(default_factory=list)
    health_checks: int = 0
    health_failures: int = 0
    health_slowest_ms: float = 0.0
    answers: int = 0
    answer_statuses: dict[str, int] = field(default_factory=dict)
    killed_at_cap: bool = False
    seconds: float = 0.0


class _Reading(asyncio.Protocol):
    """One HTTP/1.1 long poll whose answer is read and thrown away (only its status is kept), or,
    with ``read`` False, never read at all (the kernel's buffers fill, then the server's)."""

    def __init__(self, request: bytes, done: asyncio.Future[int], read: bool) -> None:
        self.request = request
        self.done = done
        self.read = read
        self.head = b""
        self.remaining = -1
        self.status = 0
        self.transport: asyncio.Transport | None = None

    def itself(self) -> _Reading:  # the protocol factory of create_connection
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)
        if not self.read:
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self.remaining < 0:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.head[:end].split(b"\r\n")
            self.status = int(lines[0].split()[1])
            length = next(
                int(v) for k, _, v in (h.partition(b":") for h in lines[1:]) if k.lower() == b"content-length"
            )
            data = self.head[end + 4 :]
            self.head = b""
            self.remaining = length
        self.remaining -= len(data)
        if self.remaining <= 0 and not self.done.done():
            self.done.set_result(self.status)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(-1)


async def _health(url: str, result: FloodResult, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT_S) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                ok = (await client.get(f"{url}/healthz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            took = (time.monotonic() - started) * 1000
            result.health_checks += 1
            result.health_failures += not ok
            result.health_slowest_ms = max(result.health_slowest_ms, took)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEALTH_EVERY_S)


async def _sample(
    service: ServiceProcess, start: int, cap: int, result: FloodResult, stop: asyncio.Event
) -> None:
    peak = start
    while not stop.is_set() and service.process.poll() is None:
        rss = rss_bytes(service.pid)
        peak = max(peak, rss)
        result.rss_peak_above_start_mb = (peak - start) / 2**20
        result.rss_end_above_start_mb = (rss - start) / 2**20
        if rss - start > cap:
            result.killed_at_cap = True
            service.kill()
            stop.set()
            return
        await asyncio.sleep(RSS_SAMPLE_S)


async def _pending_fetches(client: httpx.AsyncClient, url: str) -> int:
    return long_polls_waiting((await client.get(f"{url}/healthz")).json())


async def _flood(
    service: ServiceProcess,
    port: int,
    topic: str,
    *,
    mode: str,
    waiters: int,
    records: int,
    record_bytes: int,
    batch: int,
    min_bytes: int,
    max_bytes: int,
    rss_cap: int,
    distinct: bool = False,
) -> FloodResult:
    started = time.monotonic()
    url = service.url
    start_rss = rss_bytes(service.pid)
    result = FloodResult(mode, waiters, 0, records, record_bytes, start_rss / 2**20, 0.0, 0.0, 0)
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(service, start_rss, rss_cap, result, stop))
    health = asyncio.create_task(_health(url, result, stop))
    loop = asyncio.get_running_loop()

    def request(i: int) -> bytes:
        # distinct: waiter i asks min_bytes - i, so each is its own operation (equal long polls
        # share one): the worst case of the records gathered toward min_bytes.
        wanted = min_bytes - i if distinct else min_bytes
        query = f"offset=1&max_wait_ms={MAX_WAIT_MS}&min_bytes={wanted}&max_bytes={max_bytes}"
        path = f"/topics/{topic}/partitions/0/records?{query}"
        return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()

    answers: list[asyncio.Future[int]] = []
    closers: list[asyncio.BaseTransport] = []
    try:
        if mode == "h2":
            polls = await open_h2_long_polls(
                port, topic, waiters, 1, MAX_WAIT_MS, STREAMS_PER_CONNECTION, offset=1,
                extra_query=f"&min_bytes={min_bytes}&max_bytes={max_bytes}", keep_bodies=False,
            )  # fmt: skip
        else:
            for i in range(waiters):
                done: asyncio.Future[int] = loop.create_future()
                protocol = _Reading(request(i), done, mode == "read")
                opened, _ = await loop.create_connection(protocol.itself, "127.0.0.1", port)
                closers.append(opened)
                answers.append(done)
        async with httpx.AsyncClient(timeout=PRODUCE_TIMEOUT_S) as client:
            deadline = time.monotonic() + 60
            while (
                registered := await _pending_fetches(client, url)
            ) < waiters and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            result.registered = registered
            value = "v" * record_bytes
            body = {"records": [{"value": value, "partition": 0} for _ in range(batch)]}
            for _ in range(records // batch):
                if stop.is_set():
                    break
                try:
                    response = await client.post(f"{url}/topics/{topic}/records", json=body)
                    if response.status_code == 200:
                        result.produces_ok += 1
                    else:
                        result.produces_failed.append(f"{response.status_code} {response.text[:200]}")
                except httpx.HTTPError as exc:
                    result.produces_failed.append(repr(exc))
        if mode == "read":
            await asyncio.wait(answers, timeout=MAX_WAIT_MS / 1000 + 10)
        elif mode == "h2":
            deadline = time.monotonic() + MAX_WAIT_MS / 1000 + 10
            while time.monotonic() < deadline and not all(p.answered_ns for p in polls) and not stop.is_set():
                await asyncio.sleep(0.1)
        await asyncio.sleep(SETTLE_S)
        if mode == "h2":
            statuses = [p.status for p in polls if p.answered_ns]
            for poll in polls:
                poll.close()
        else:
            statuses = [f.result() for f in answers if f.done()]
            for each in closers:
                each.close()
        result.answers = len(statuses)
        for status in statuses:
            result.answer_statuses[str(status)] = result.answer_statuses.get(str(status), 0) + 1
        await asyncio.sleep(SETTLE_S)  # the clients left: does the service let go?
    finally:
        stop.set()
        await asyncio.gather(sampler, health)
        for each in closers:
            each.close()
    result.seconds = time.monotonic() - started
    return result


def flood(
    *,
    mode: str = "idle",
    waiters: int = 1_000,
    records: int = 200,
    record_bytes: int = 100_000,
    batch: int = 10,
    min_bytes: int = 16_000_000,
    max_bytes: int = 16 * 1024 * 1024,
    rss_cap_mb: int = 3_000,
    env: dict[str, str] | None = None,
    bootstrap: str | None = None,
    distinct: bool = False,
) -> FloodResult:
    """One run of the attack (module docstring); the service is started and stopped here.

    ``distinct`` (HTTP/1.1 modes): waiter i asks ``min_bytes - i`` (one operation each).
    """
    if distinct and mode == "h2":
        raise ValueError("distinct min_bytes: HTTP/1.1 modes only (idle, read)")
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    def run(bootstrap: str) -> FloodResult:
        topic = f"flood-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=30).values():
            future.result(timeout=30)
        producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        producer.produce(topic, b"written-before", partition=0)  # the polls wait at offset 1
        producer.flush(30)
        port = free_port()
        # The fanout bench's service process (as deployed: ``serve``, its stop and kill by PID).
        service = ServiceProcess(bootstrap, port, env=env)
        try:
            service.wait_ready()
            # One answered poll first: metadata cached, clients built (the start RSS is warm).
            with urllib.request.urlopen(
                f"{service.url}/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=0", timeout=30
            ) as response:  # loopback
                response.read()
            return asyncio.run(
                _flood(
                    service, port, topic, mode=mode, waiters=waiters, records=records,
                    record_bytes=record_bytes, batch=batch, min_bytes=min_bytes, max_bytes=max_bytes,
                    rss_cap=rss_cap_mb * 2**20, distinct=distinct,
                )
            )  # fmt: skip
        finally:
            service.stop()
            admin.delete_topics([topic], request_timeout=30)

    if bootstrap is not None:
        return run(bootstrap)
    with provide_cluster(load_settings().kafka) as cluster:
        return run(cluster.bootstrap_servers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="min_bytes_flood", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["idle", "read", "h2"], action="append")
    parser.add_argument("-n", "--waiters", type=int, default=1_000)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--record-bytes", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--min-bytes", type=int, default=16_000_000)
    parser.add_argument("--max-bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--rss-cap-mb", type=int, default=3_000, help="kill the service past this growth")
    parser.add_argument("--limit-mb", type=int, default=1_024, help="pass: peak RSS growth under this")
    parser.add_argument(
        "--distinct", action="store_true", help="waiter i asks min_bytes - i (idle, read): one operation each"
    )
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the service (repeatable)")
    args = parser.parse_args(argv)
    failed = False
    with provide_cluster(load_settings().kafka) as cluster:
        for mode in args.mode or ["idle", "read", "h2"]:
            result = flood(
                mode=mode, waiters=args.waiters, records=args.records, record_bytes=args.record_bytes,
                batch=args.batch, min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                rss_cap_mb=args.rss_cap_mb, bootstrap=cluster.bootstrap_servers, distinct=args.distinct,
                env=dict(each.split("=", 1) for each in args.env),
            )  # fmt: skip
            ok = (
                not result.killed_at_cap
                and result.rss_peak_above_start_mb < args.limit_mb
                and not result.produces_failed
                and result.health_failures == 0
            )
            failed |= not ok
            print(("PASS " if ok else "FAIL ") + json.dumps(asdict(result)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
