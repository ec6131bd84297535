"""``purgatory bench produce``: produce-and-wait through us, against the plain producer.

What a user writes without us is the baseline: a confluent-kafka ``Producer`` (``acks=all``,
``enable.idempotence``, ``linger.ms`` 1) whose delivery reports are awaited as asyncio futures —
a thread polls the producer, the delivery callback hands each report to the loop with
``call_soon_threadsafe`` (:class:`PlainProducer`, about twenty lines). Two ways in, each compared
with its plain twin:

* **library**: ``await kp.aio.produce([record])`` (:class:`AsyncKafkaPurgatory`) against
  ``await plain.produce([record])``, in the measuring process;
* **http**: ``POST /topics/{t}/records`` served by our service (``python -m
  purgatory.adapters.service.serve``, as deployed) against a plain Starlette route on a
  :class:`PlainProducer` served by uvicorn's defaults (:func:`plain_app`; h11 and asyncio's loop
  here, as our service runs); the load comes from one client process (HTTP/1.1 keep-alive, as
  many connections as requests in flight, :class:`_Connection`), the same for both sides.

Workloads, each measured after an unmeasured warm-up at the same concurrency: ``sequential``
(one produce at a time) and ``cN`` (N produces in flight, ``--concurrency``); one record of
``VALUE_BYTES`` per produce, keyed by its index (librdkafka's partitioner spreads them). Cluster:
a local Apache Kafka of ``--brokers`` brokers (the project's launcher, 127.0.0.1, stopped by PID
at the end; or the cluster ``PURGATORY_KAFKA_BOOTSTRAP`` names, for 1 broker), one topic of
``--partitions`` partitions with replication factor = brokers (``min.insync.replicas`` 2 from
3 brokers), shared by every run of both sides and warmed by an unmeasured plain burst first.

Every run is one side in fresh processes (its client process; for http also its server),
running every workload in turn; repeat ``r`` starts with the other side than ``r - 1``. Figures:
records/s, p50 / p99 of the produce call (library) or the HTTP request (http), and CPU per
record: the client process's user + sys (library), the server process's (http; the load
client's is printed too). Printed: each side's medians and the median of the same-run ratios
ours / plain with the targets (``TARGETS``) met or missed; the runs go to
``bench-results/produce-<stamp>.json``. ``--linger-ms 1 --linger-ms 5`` measures each of our
lingers against the same plain side (how ``kafka.produce_linger_ms`` was chosen).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaError, Message, Producer
from purgatory.adapters.kafka import provide_cluster
from purgatory.adapters.kafka.local import free_port

from purgatory.settings import load_settings

from ..measure import ChildFailed, ChildServer, cpu_seconds, percentile, result_of_child

__all__ = ["TARGETS", "PlainProducer", "plain_app", "produce", "run_side"]

SIDES = ("purgatory", "plain")
APIS = ("library", "http")
VALUE_BYTES = 100  # one small record per produce, as an HTTP produce usually carries
VALUE = "v" * VALUE_BYTES  # ASCII: as many bytes as characters in the HTTP body and in Kafka
PLAIN_LINGER_MS = 1
# Client tuning both sides share (the comparison is of the produce paths, not of librdkafka
# settings): Nagle off, as our sender runs; with it on, a 1 ms linger waits for delayed ACKs.
PLAIN_CLIENT = {"socket.nagle.disable": True}
WARMUP_MIN = 200  # records per workload before it is measured (connections, batches, JIT in brokers)
CLUSTER_WARMUP = 3000  # records a plain producer sends before the first run (the brokers' JIT)
PLAIN_POLL_S = 0.1  # the plain producer's poll thread: reports wake it at once
SERVER_READY_S = 60.0
STOP_S = 15.0
TOPIC_TIMEOUT_S = 30.0
SIDE_TIMEOUT_S = 900.0
RESULT_MARKER = "@@produce-bench-result@@ "

# (figure, target ratio ours / plain, whether lower is better): the targets.
TARGETS: tuple[tuple[str, float, bool], ...] = (
    ("per_s", 1.0, False),  # throughput at least the plain side's
    ("p99_ms", 1.1, True),  # p99 within 10 % of the plain side's
    ("cpu_us", 1.2, True),  # CPU per record within 20 % (library: client; http: server)
)


# -- the baseline ---------------------------------------------------------------------------------


class PlainProducer:
    """The baseline: an idempotent producer, delivery reports awaited as asyncio futures."""

    def __init__(self, bootstrap: str, loop: asyncio.AbstractEventLoop, linger_ms: int) -> None:
        self.loop = loop
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": linger_ms,
                **PLAIN_CLIENT,
            }
        )
        self.stopping = threading.Event()
        self.poller = threading.Thread(target=self._poll, name="plain-producer-poll", daemon=True)
        self.poller.start()

    def _poll(self) -> None:
        while not self.stopping.is_set():
            self.producer.poll(PLAIN_POLL_S)

    async def produce(self, topic: str, records: list[tuple[bytes | None, bytes]]) -> list[int]:
        """Offsets of ``records`` (key, value) once each is acknowledged; raises on a failure."""
        futures = []
        for key, value in records:
            future: asyncio.Future[int] = self.loop.create_future()

            def delivered(
                error: KafkaError | None, message: Message, future: asyncio.Future[int] = future
            ) -> None:
                self.loop.call_soon_threadsafe(_settle, future, error, message.offset())

            self.producer.produce(topic, value, key, on_delivery=delivered)
            futures.append(future)
        return list(await asyncio.gather(*futures))

    def close(self) -> None:
        self.producer.flush(STOP_S)
        self.stopping.set()
        self.poller.join(STOP_S)


def _settle(future: asyncio.Future[int], error: KafkaError | None, offset: int | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(RuntimeError(str(error)))
    else:
        future.set_result(-1 if offset is None else offset)


def plain_app(bootstrap: str, linger_ms: int) -> Any:
    """The plain HTTP side: ``POST /topics/{topic}/records`` with the body our service takes
    (``{"records": [{"key": ..., "value": ...}]}``), answered with each record's offset."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    plain: list[PlainProducer] = []

    async def produce_records(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        records = [
            (None if r.get("key") is None else r["key"].encode(), r["value"].encode())
            for r in body["records"]
        ]
        try:
            offsets = await plain[0].produce(request.path_params["topic"], records)
        except RuntimeError as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse({"offsets": offsets})

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        plain.append(PlainProducer(bootstrap, asyncio.get_running_loop(), linger_ms))
        yield
        plain[0].close()

    return Starlette(
        routes=[
            Route("/topics/{topic}/records", produce_records, methods=["POST"]),
            Route("/healthz", healthz),
        ],
        lifespan=lifespan,
    )


def _plain_server_main(bootstrap: str, port: str, linger_ms: str) -> None:
    """``python -m purgatory.tools.bench.kafka.produce plain-server <bootstrap> <port> <linger>``."""
    import uvicorn

    uvicorn.run(
        plain_app(bootstrap, int(linger_ms)),
        host="127.0.0.1",
        port=int(port),
        log_level="warning",
        access_log=False,
        backlog=4096,
    )


# -- one side's run (its own process) -----------------------------------------------------------


def _server_cpu_s(pid: int | None) -> float:
    return 0.0 if pid is None else cpu_seconds(pid)  # no server (the library case): 0


Call = Callable[[int, int], Awaitable[bool]]  # (record index, worker slot) -> produced


async def _drive(call: Call, first: int, count: int, concurrency: int) -> tuple[list[float], int, float]:
    """``count`` calls, ``concurrency`` in flight; (latencies in s, failures, elapsed s)."""
    latencies: list[float] = []
    failures = 0
    index = first
    end = first + count

    async def worker(slot: int) -> None:
        nonlocal index, failures
        while index < end:
            i = index
            index += 1
            started = time.perf_counter()
            ok = await call(i, slot)
            latencies.append(time.perf_counter() - started)
            failures += not ok

    started = time.perf_counter()
    await asyncio.gather(*(worker(slot) for slot in range(concurrency)))
    return latencies, failures, time.perf_counter() - started


async def _workloads(
    call: Call,
    spec: dict[str, Any],
    server_pid: int | None,
    prepare: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Each workload of ``spec``: ``prepare(concurrency)``, the warm-up, then the measured part."""
    out: dict[str, Any] = {}
    first = 0
    for name, concurrency, count in spec["workloads"]:
        if prepare is not None:
            await prepare(concurrency)
        warmup = max(WARMUP_MIN, 2 * concurrency)
        await _drive(call, first, warmup, concurrency)
        first += warmup
        server0, cpu0 = _server_cpu_s(server_pid), time.process_time()
        latencies, failures, elapsed = await _drive(call, first, count, concurrency)
        cpu, server = time.process_time() - cpu0, _server_cpu_s(server_pid) - server0
        first += count
        ms = sorted(x * 1000.0 for x in latencies)
        client_us = cpu / count * 1e6
        out[name] = {
            "records": count,
            "concurrency": concurrency,
            "failures": failures,
            "per_s": count / elapsed,
            "p50_ms": percentile(ms, 0.50),
            "p99_ms": percentile(ms, 0.99),
            "max_ms": ms[-1],
            "client_cpu_us": client_us,
            "server_cpu_us": server / count * 1e6 if server_pid is not None else float("nan"),
            # The compared CPU: the process that does the produce (library: the client).
            "cpu_us": server / count * 1e6 if server_pid is not None else client_us,
        }
    return out


async def _library_side(spec: dict[str, Any]) -> dict[str, Any]:
    topic, bootstrap = spec["topic"], spec["bootstrap"]
    value = VALUE.encode()
    if spec["side"] == "purgatory":
        from purgatory.adapters.kafka import KafkaPurgatory, ProducerRecord

        settings = load_settings().kafka.model_copy(
            update={"bootstrap_servers": bootstrap, "produce_linger_ms": spec["linger_ms"]}
        )
        kp = KafkaPurgatory.connect(settings, name="bench-produce", configure_logging=False, metrics=False)
        aio = kp.aio

        async def ours(i: int, _: int) -> bool:
            result = await aio.produce([ProducerRecord(topic, value, key=b"%d" % i)])
            return bool(result.succeeded)

        try:
            return await _workloads(ours, spec, None)
        finally:
            kp.close()
    plain = PlainProducer(bootstrap, asyncio.get_running_loop(), spec["linger_ms"])

    async def baseline(i: int, _: int) -> bool:
        try:
            await plain.produce(topic, [(b"%d" % i, value)])
        except RuntimeError:
            return False
        return True

    try:
        return await _workloads(baseline, spec, None)
    finally:
        plain.close()


class _Connection:
    """One keep-alive HTTP/1.1 connection of the load client: a request, then its whole answer.

    Not httpx: at ~3 ms of CPU per request it was the bottleneck of both sides (250 requests/s on
    the 2-core machine); this costs a write, a ``readuntil`` of the head, a ``readexactly`` of the
    body. Each worker of ``_drive`` owns one connection (as many as requests in flight).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, head: bytes, body: bytes) -> int:
        """Send one request, read its answer in full; its status code."""
        self.writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        answer = await self.reader.readuntil(b"\r\n\r\n")
        status = int(answer[9:12])
        lower = answer.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError(f"an answer without content-length: {answer[:200]!r}")
        length = int(lower[at + 17 : lower.index(b"\r\n", at + 2)])
        await self.reader.readexactly(length)
        return status


async def _http_side(spec: dict[str, Any]) -> dict[str, Any]:
    host, port = spec["url"].removeprefix("http://").split(":")
    connections: list[_Connection] = []

    async def connect(concurrency: int) -> None:
        # Fresh connections per workload, before its warm-up: a connection idle through the
        # previous workload (256 of them during the sequential one) outlives uvicorn's keep-alive
        # timeout (5 s) and is closed by the server, on both sides alike.
        for connection in connections:
            connection.writer.close()
        connections[:] = [
            _Connection(*await asyncio.open_connection(host, int(port))) for _ in range(concurrency)
        ]

    head = (
        f"POST /topics/{spec['topic']}/records HTTP/1.1\r\nhost: {host}:{port}\r\n"
        "content-type: application/json\r\n"
    ).encode()

    async def post(i: int, slot: int) -> bool:
        body = json.dumps({"records": [{"key": str(i), "value": VALUE}]}).encode()
        return await connections[slot].post(head, body) == 200

    try:
        return await _workloads(post, spec, spec["server_pid"], connect)
    finally:
        for connection in connections:
            connection.writer.close()


def run_side(spec: dict[str, Any]) -> dict[str, Any]:
    """One side's run of every workload (``spec``: side, api, bootstrap, topic, workloads, ...)."""
    run = _library_side if spec["api"] == "library" else _http_side
    return {"workloads": asyncio.run(run(spec))}


# -- the orchestration (this process) -----------------------------------------------------------


class _Server(ChildServer):
    """One side's HTTP server in a child process of its own; stopped by its PID."""

    def __init__(self, side: str, bootstrap: str, linger_ms: int) -> None:
        port = free_port()
        env = {**os.environ, "PURGATORY_LOG__LEVEL": "WARNING"}
        if side == "purgatory":
            env |= {
                "PURGATORY_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
                "PURGATORY_KAFKA__PRODUCE_LINGER_MS": str(linger_ms),
            }
            command = [sys.executable, "-m", "purgatory.adapters.service.serve", "--port", str(port)]
            command += ["--backlog", "4096"]
        else:
            command = [sys.executable, "-m", __name__, "plain-server", bootstrap, str(port), str(linger_ms)]
        super().__init__(command, env, port, stop_timeout_s=STOP_S)

    def wait_ready(self, timeout_s: float = SERVER_READY_S, poll_s: float = 0.2) -> None:
        super().wait_ready(timeout_s, poll_s)


def _run_in_process(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        return result_of_child(
            [sys.executable, "-m", __name__, "side", json.dumps(spec)],
            env={**os.environ, "PURGATORY_LOG__LEVEL": "WARNING"},
            timeout_s=SIDE_TIMEOUT_S,
            marker=RESULT_MARKER,
        )
    except ChildFailed as exc:
        raise RuntimeError(f"side {spec['side']} ({spec['api']}) failed ({exc})") from None


def run_once(spec: dict[str, Any]) -> dict[str, Any]:
    """One side's run in fresh processes: the client (and for http its own server first)."""
    if spec["api"] == "library":
        return _run_in_process(spec)
    server = _Server(spec["side"], spec["bootstrap"], spec["linger_ms"])
    try:
        server.wait_ready()
        return _run_in_process({**spec, "url": server.url, "server_pid": server.pid})
    finally:
        server.stop()


def create_bench_topic(bootstrap: str, brokers: int, partitions: int) -> str:
    """The topic every run of both sides uses: RF = brokers, ``min.insync.replicas`` 2 from 3."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"bench-produce-{uuid.uuid4().hex[:8]}"
    config = {"min.insync.replicas": "2"} if brokers >= 3 else {}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, partitions, brokers, config=config)
    for future in admin.create_topics([new], request_timeout=TOPIC_TIMEOUT_S).values():
        future.result(timeout=TOPIC_TIMEOUT_S + 1.0)
    deadline = time.monotonic() + TOPIC_TIMEOUT_S
    while time.monotonic() < deadline:
        described = admin.list_topics(topic, timeout=TOPIC_TIMEOUT_S).topics.get(topic)
        partition_list = list(described.partitions.values()) if described is not None else []
        if len(partition_list) == partitions and all(
            p.leader >= 0 and len(p.isrs) == brokers for p in partition_list
        ):
            return topic
        time.sleep(0.2)
    raise RuntimeError(f"bench topic {topic} has no leaders or full ISRs after {TOPIC_TIMEOUT_S:.0f} s")


def _warm_cluster(bootstrap: str, topic: str, records: int) -> None:
    """An unmeasured burst on the bench topic: the brokers' produce path compiled before run 1."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 1})
    value = VALUE.encode()
    for i in range(records):
        producer.produce(topic, value, b"%d" % i)
        producer.poll(0)
    producer.flush(TOPIC_TIMEOUT_S)


def _ratios(runs: dict[str, list[dict[str, Any]]], workload: str, figure: str) -> list[float]:
    """Same-repeat ratios ours / plain of one workload's ``figure``."""
    return [
        ours["workloads"][workload][figure] / plain["workloads"][workload][figure]
        for ours, plain in zip(runs["purgatory"], runs["plain"], strict=False)
        if plain["workloads"][workload][figure] > 0
    ]


def _median_of(runs: list[dict[str, Any]], workload: str, figure: str) -> float:
    return float(statistics.median(run["workloads"][workload][figure] for run in runs))


def summarize(runs: dict[str, list[dict[str, Any]]], workloads: list[str]) -> list[dict[str, Any]]:
    """Per workload: each side's medians, the median same-run ratios, the targets' verdicts."""
    rows = []
    for workload in workloads:
        medians = {
            side: {
                figure: _median_of(runs[side], workload, figure)
                for figure in ("per_s", "p50_ms", "p99_ms", "cpu_us", "client_cpu_us", "server_cpu_us")
            }
            for side in SIDES
        }
        ratios = {
            figure: statistics.median(r) if (r := _ratios(runs, workload, figure)) else float("nan")
            for figure in ("per_s", "p50_ms", "p99_ms", "cpu_us", "client_cpu_us")
        }
        verdicts = {
            figure: (ratios[figure] <= limit) if lower else (ratios[figure] >= limit)
            for figure, limit, lower in TARGETS
        }
        failures = sum(run["workloads"][workload]["failures"] for side in SIDES for run in runs[side])
        rows.append(
            {
                "workload": workload,
                "medians": medians,
                "ratios": ratios,
                "met": verdicts,
                "failures": failures,
            }
        )
    return rows


def _print_case(title: str, api: str, rows: list[dict[str, Any]]) -> None:
    typer.echo(title)
    cpu = "client CPU" if api == "library" else "server CPU"
    typer.echo(
        f"  {'workload':<10} {'side':<9} {'records/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{cpu + ' us/rec':>18}" + (f" {'load client us/rec':>18}" if api == "http" else "")
    )
    for row in rows:
        for side in SIDES:
            m = row["medians"][side]
            typer.echo(
                f"  {row['workload']:<10} {side:<9} {m['per_s']:>9.0f} {m['p50_ms']:>7.2f} "
                f"{m['p99_ms']:>7.2f} {m['cpu_us']:>18.0f}"
                + (f" {m['client_cpu_us']:>18.0f}" if api == "http" else "")
            )
        verdicts = ", ".join(
            f"{label} {row['ratios'][figure]:.2f}x ({'<=' if lower else '>='} {limit}: "
            f"{'met' if row['met'][figure] else 'MISSED'})"
            for (figure, limit, lower), label in zip(TARGETS, ("throughput", "p99", "CPU/rec"), strict=True)
        )
        typer.echo(
            f"  {row['workload']:<10} ours/plain: {verdicts}; p50 {row['ratios']['p50_ms']:.2f}x"
            + (f"; failures {row['failures']}" if row["failures"] else "")
        )


def produce(
    brokers: Annotated[
        list[int] | None, typer.Option("--brokers", help="Broker counts (default 1 and 3; --quick: 1).")
    ] = None,
    apis: Annotated[
        list[str] | None, typer.Option("--api", help="library and/or http (default both).")
    ] = None,
    concurrency: Annotated[
        list[int] | None,
        typer.Option("--concurrency", help="Produces in flight, besides sequential (default 32 and 256)."),
    ] = None,
    records: Annotated[
        int | None, typer.Option(min=1, help="Measured records per concurrent workload (default 3000).")
    ] = None,
    sequential_records: Annotated[
        int | None, typer.Option(min=1, help="Measured records of the sequential workload (default 500).")
    ] = None,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the bench topic.")] = 6,
    linger_ms: Annotated[
        list[int] | None,
        typer.Option(
            "--linger-ms",
            help="Our producer's linger (kafka.produce_linger_ms; default: the setting); repeat the "
            "option to compare several against the same plain side.",
        ),
    ] = None,
    plain_linger_ms: Annotated[int, typer.Option(min=0, help="The plain producer's linger.ms.")] = (
        PLAIN_LINGER_MS
    ),
    repeats: Annotated[
        int | None, typer.Option("--repeats", "-r", min=1, help="Runs per side and case (default 3).")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="1 broker, 1,000 + 200 records, 1 repeat (unless given).")
    ] = False,
    out: Annotated[Path, typer.Option(help="Directory for the JSON result file.")] = Path("bench-results"),
) -> None:
    """Produce-and-wait through us (library, HTTP service) vs the plain producer, same run."""
    settings = load_settings().kafka
    broker_counts = brokers or ([1] if quick else [1, 3])
    records = records or (1000 if quick else 3000)
    sequential_records = sequential_records or (200 if quick else 500)
    repeats = repeats or (1 if quick else 3)
    lingers = linger_ms or [settings.produce_linger_ms]
    for api in apis or APIS:
        if api not in APIS:
            raise typer.BadParameter(f"--api must be library or http, got {api!r}", param_hint="--api")
    workloads: list[tuple[str, int, int]] = [("sequential", 1, sequential_records)]
    workloads += [(f"c{c}", c, records) for c in concurrency or [32, 256]]
    names = [name for name, _, _ in workloads]
    options = {
        "brokers": broker_counts, "apis": apis or list(APIS), "workloads": workloads,
        "partitions": partitions, "linger_ms": lingers, "plain_linger_ms": plain_linger_ms,
        "repeats": repeats, "value_bytes": VALUE_BYTES,
    }  # fmt: skip
    cases: list[dict[str, Any]] = []
    started = time.monotonic()
    for count in broker_counts:
        with provide_cluster(settings, brokers=count) as cluster:
            bootstrap = cluster.bootstrap_servers
            topic = create_bench_topic(bootstrap, count, partitions)
            _warm_cluster(bootstrap, topic, CLUSTER_WARMUP)
            typer.echo(
                f"\n{count} broker(s) via {cluster.provider} at {bootstrap}: topic {partitions} partitions, "
                f"RF {count}{', min.insync.replicas 2' if count >= 3 else ''}; {VALUE_BYTES} B records; "
                f"linger ours {'/'.join(map(str, lingers))} ms, plain {plain_linger_ms} ms; x{repeats}; "
                f"load {os.getloadavg()[0]:.1f}"
            )
            for api in apis or APIS:
                for linger in lingers:
                    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
                    failed: str | None = None
                    for repeat in range(repeats):
                        for side in SIDES if repeat % 2 == 0 else tuple(reversed(SIDES)):
                            spec = {
                                "side": side, "api": api, "bootstrap": bootstrap, "topic": topic,
                                "workloads": workloads,
                                "linger_ms": linger if side == "purgatory" else plain_linger_ms,
                            }  # fmt: skip
                            try:
                                result = run_once(spec)
                            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                                # This case ends here (its runs so far are kept); the others run.
                                failed = str(exc)
                                typer.echo(f"{api}, {count} broker(s): {side} failed: {failed}", err=True)
                                break
                            result["load"] = os.getloadavg()[0]
                            runs[side].append(result)
                        else:
                            continue
                        break
                    if not runs["purgatory"] or not runs["plain"]:
                        cases.append({"brokers": count, "api": api, "linger_ms": linger, "error": failed})
                        continue
                    rows = summarize(runs, names)
                    done = min(len(runs[side]) for side in SIDES)
                    title = f"{api}, {count} broker(s), our linger {linger} ms — medians of {done}"
                    _print_case(title + (" (then a side failed)" if failed else ""), api, rows)
                    case = {"brokers": count, "api": api, "linger_ms": linger, "summary": rows, "runs": runs}
                    case["error"] = failed
                    cases.append(case)
    typer.echo(f"\ntotal {time.monotonic() - started:.0f} s")
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"produce-{stamp}.json"
    environment = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    payload = {"bench": "produce", "created": stamp, "options": options, "environment": environment}
    path.write_text(json.dumps(payload | {"cases": cases}, indent=1, default=str) + "\n")
    typer.echo(f"results: {path}")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "side":
        result = run_side(json.loads(argv[2]))
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    if len(argv) == 5 and argv[1] == "plain-server":
        _plain_server_main(*argv[2:])
        return 0
    print(f"usage: python -m {__name__} side '<json spec>' | plain-server <bootstrap> <port> <linger>")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
