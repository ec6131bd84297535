"""``purgatory bench chaos --seeds N``: Jepsen's method on the local 3-broker cluster.

Per seed, against one local cluster of three KRaft voters (reused across seeds: every seed ends
with it healed and checked healthy) and the HTTP service as a child process
(``python -m purgatory.adapters.service.serve``, as deployed):

1. a fresh topic (3 partitions, RF 3, ``min.insync.replicas=2``), a request topic with an
   echoing :class:`Responder`, a consumer group for the commit waits;
2. mixed load for ``--seconds``: produces (``POST /topics/{t}/records``, 1-3 records with unique
   values), a long poller per partition following the log (``GET .../records?offset=``), commit
   waits (``wait_committed`` through the library: the service has no route for them) racing the
   commits they wait for, and request-reply through the library — while the schedule of
   :mod:`._chaos_schedule` (drawn from ``random.Random(seed)``) kills, pauses and stops nodes
   (controllers included: all three are voters) and bounces the service (SIGTERM, restart);
3. once the load stopped and every call was answered or given up on, the cluster and the
   service are healed, every partition is read back with a plain consumer and
   :func:`._chaos_check.check` lists the violations.

A seed prints one line of counts; a failing one also its schedule (planned and actual times) and
the command that replays it. Exit 1 on any violation.

Needs the ``kafka`` extra and ``httpx`` (dev). Processes: the cluster's JVMs (stopped by PID by
the cluster at the end, or left to the caller who passed one in) and the service (stopped by PID
after each seed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import structlog.testing
import typer

from ._chaos_check import (
    CONNECTION,
    Bounds,
    CheckResult,
    CommitIssue,
    CommitWait,
    History,
    PollCall,
    ProduceCall,
    RequestCall,
    check,
)
from ._chaos_schedule import Fault, draw_schedule, format_schedule

__all__ = ["ChaosRunner", "SeedResult", "chaos"]

PARTITIONS = 3
REQUEST_TIMEOUT_MS = 2000  # the service's and the library's kafka.request_timeout_ms
PRODUCE_TIMEOUT_MS = 8000  # each produce's timeout_ms: past a leader failover (3 s session + election)
COMMIT_TIMEOUT_MS = 5000
RR_TIMEOUT_MS = 5000
PRODUCERS, REQUESTERS = 3, 2
PRODUCE_PAUSE_S = 0.02  # between one producer's requests: load, not a flood of 2 shared cores
CLIENT_GRACE_S = 10.0  # an HTTP call is given up on this long past its bound (then: "no answer")
SERVICE_START_S = 60.0
SERVICE_STOP_S = 15.0
GRACEFUL_SHUTDOWN_S = 5
HEAL_S = 90.0
READ_BACK_S = 60.0
WARM_UP_MS = 30_000


def _now(origin: float) -> float:
    return time.monotonic() - origin


class ServiceChild:
    """The service as a child process on a fixed loopback port, restartable (bounced) by PID.

    stderr goes to a file (a pipe nobody reads would fill and block the service mid-run).
    """

    def __init__(self, bootstrap: str, port: int, log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.log_path = log_path
        self.env = {
            **os.environ,
            "PURGATORY_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "PURGATORY_KAFKA__REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS),
            "PURGATORY_LOG__LEVEL": "WARNING",
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []  # every process started (one per bounce), for the caller's check

    def start(self) -> None:
        command = [
            sys.executable, "-m", "purgatory.adapters.service.serve", "--host", "127.0.0.1",
            "--port", str(self.port), "--graceful-shutdown-s", str(GRACEFUL_SHUTDOWN_S),
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, env=self.env, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL
            )
        self.pids.append(self.process.pid)

    def wait_ready(self, timeout_s: float = SERVICE_START_S) -> None:
        """Poll ``/healthz`` (a child process gives no readiness event) until it answers ok."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"the service exited; see {self.log_path}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer,  # loopback
            ):
                if answer.status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the service did not answer /healthz within {timeout_s:.0f} s")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        from purgatory.tools.bench.measure import stop_child

        if self.process is not None:
            stop_child(self.process, SERVICE_STOP_S)


@dataclass
class SeedResult:
    seed: int
    seconds: float
    schedule: list[Fault]
    ran: list[tuple[float, float]]
    result: CheckResult
    errors: list[str] = field(default_factory=list)  # the run itself failed (setup, heal, read-back)
    service_pids: list[int] = field(default_factory=list)  # each stopped by PID before returning

    @property
    def ok(self) -> bool:
        return self.result.ok and not self.errors


class _Nemesis(threading.Thread):
    """Runs the schedule in order on its own thread; records when each fault began and healed.

    Stops starting faults once the load is over (a slow restart pushes the plan back, keeping
    its gaps); the fault in progress is always healed.
    """

    def __init__(self, faults: list[Fault], cluster: Any, service: ServiceChild, origin: float) -> None:
        super().__init__(name="chaos-nemesis", daemon=True)
        self.faults, self.cluster, self.service, self.origin = faults, cluster, service, origin
        self.load_over = threading.Event()
        self.ran: list[tuple[float, float]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            planned_healed = healed = 0.0
            for fault in self.faults:
                # The plan's healthy gap before this fault is kept after a heal that ran long
                # (a restart waits for the cluster): the next fault never lands on a node or a
                # service still coming back, which the schedule does not mean to test.
                start = max(fault.at_s, healed + (fault.at_s - planned_healed))
                # A timer, not a synchronisation: the plan says when; load_over cuts it short.
                if self.load_over.wait(max(0.0, start - _now(self.origin))):
                    return
                began = _now(self.origin)
                self._inject(fault)
                time.sleep(fault.hold_s)  # how long the fault lasts: the plan's duration, by design
                self._heal(fault)
                healed, planned_healed = _now(self.origin), fault.at_s + fault.hold_s
                self.ran.append((began, healed))
        except BaseException as exc:  # reported by the runner as a failed run, not swallowed
            self.error = exc

    def _inject(self, fault: Fault) -> None:
        if fault.target is None:
            self.service.stop()
        elif fault.action == "kill":
            self.cluster.kill_broker(fault.target)
        elif fault.action == "pause":
            self.cluster.pause_broker(fault.target)
        else:
            self.cluster.stop_broker(fault.target)

    def _heal(self, fault: Fault) -> None:
        if fault.target is None:
            self.service.start()
            self.service.wait_ready()
        elif fault.action == "pause":
            self.cluster.resume_broker(fault.target)
        else:
            self.cluster.start_broker(fault.target, timeout_s=HEAL_S)


class _Load:
    """The clients of one seed: HTTP produces and long polls, library commit waits and requests."""

    def __init__(
        self,
        runner: ChaosRunner,
        topic: str,
        rr_topic: str,
        group: str,
        kp: Any,
        committer: _Committer,
        origin: float,
    ) -> None:
        self.runner, self.topic, self.rr_topic, self.group = runner, topic, rr_topic, group
        self.kp, self.committer, self.origin = kp, committer, origin
        self.history = History()
        self.stop = asyncio.Event()
        self.rng = random.Random(runner.seed ^ 0x5EED)  # the load's choices (not its timing)
        self.next_produce = 0
        self.bounds = runner.bounds

    async def run(self, seconds: float) -> None:
        import httpx

        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(base_url=self.runner.service.url, limits=limits) as client:
            tasks = [asyncio.create_task(self._producer(client)) for _ in range(PRODUCERS)]
            tasks += [asyncio.create_task(self._poller(client, p)) for p in range(PARTITIONS)]
            tasks += [asyncio.create_task(self._requester(i)) for i in range(REQUESTERS)]
            tasks.append(asyncio.create_task(self._commit_waits()))
            await asyncio.sleep(seconds)  # the load's length: a duration, by design
            self.stop.set()
            # Every call still open gets its bound and the client's grace; then it is given up
            # on (recorded as no answer) — nothing is awaited forever here either.
            longest = max(
                self.bounds.produce(PRODUCE_TIMEOUT_MS),
                self.bounds.poll(self.runner.max_wait_ms),
                self.bounds.commit(COMMIT_TIMEOUT_MS) + 3.0,
            )
            _done, pending = await asyncio.wait(tasks, timeout=longest + CLIENT_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pause_after_error(self) -> None:
        # A refused connection (service bouncing) answers at once: do not spin on it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), 0.2)

    async def _producer(self, client: Any) -> None:
        import httpx

        while not self.stop.is_set():
            rid = self.next_produce
            self.next_produce += 1
            count = self.rng.randint(1, 3)
            home = self.rng.randrange(PARTITIONS)
            # Mostly one partition (order within it is checked); sometimes spanning two.
            parts = [home if self.rng.random() < 0.8 else (home + 1) % PARTITIONS for _ in range(count)]
            records = [(p, f"s{self.runner.seed}-r{rid}-{i}") for i, p in enumerate(parts)]
            call = ProduceCall(rid, records, PRODUCE_TIMEOUT_MS, _now(self.origin))
            self.history.produces.append(call)
            body = {
                "records": [{"value": v, "partition": p} for p, v in records],
                "timeout_ms": PRODUCE_TIMEOUT_MS,
            }
            bound = self.bounds.produce(PRODUCE_TIMEOUT_MS)
            try:
                answer = await client.post(
                    f"/topics/{self.topic}/records", json=body, timeout=bound + CLIENT_GRACE_S
                )
                call.status = answer.status_code
                if answer.status_code == 200:
                    call.offsets = [r["offset"] for r in answer.json()["records"]]
            except httpx.TimeoutException:
                pass  # no answer within the bound and the grace: the checker says so
            except httpx.TransportError:
                call.status = CONNECTION
            finally:
                call.elapsed_s = _now(self.origin) - call.started_s
            if call.status != 200:
                await self._pause_after_error()
            else:
                await asyncio.sleep(PRODUCE_PAUSE_S)

    async def _poller(self, client: Any, partition: int) -> None:
        import httpx

        offset = 0
        while not self.stop.is_set():
            max_wait = self.rng.randint(200, self.runner.max_wait_ms)
            call = PollCall(partition, offset, max_wait, _now(self.origin))
            self.history.polls.append(call)
            try:
                answer = await client.get(
                    f"/topics/{self.topic}/partitions/{partition}/records",
                    params={"offset": offset, "max_wait_ms": max_wait},
                    timeout=self.bounds.poll(max_wait) + CLIENT_GRACE_S,
                )
                call.status = answer.status_code
                if answer.status_code == 200:
                    body = answer.json()
                    call.records = [(r["offset"], r.get("value")) for r in body["records"]]
                    offset = body["next_offset"]
            except httpx.TimeoutException:
                pass
            except httpx.TransportError:
                call.status = CONNECTION
            finally:
                call.elapsed_s = _now(self.origin) - call.started_s
            if call.status != 200:
                await self._pause_after_error()

    async def _commit_waits(self) -> None:
        """Race a wait for offset T against the commit of T (issued 0-1.5 s later)."""
        from purgatory.adapters.kafka import TopicPartitionKey

        key = TopicPartitionKey(self.topic, 0)
        target = 0
        while not self.stop.is_set():
            target += 1
            wait = CommitWait(target, COMMIT_TIMEOUT_MS, _now(self.origin))
            self.history.commit_waits.append(wait)
            waiting = asyncio.create_task(self._wait_commit(wait, key))
            await asyncio.sleep(self.rng.uniform(0.0, 1.5))  # the race's offset: by design
            self.committer.commit(target, self.history.commits, lambda: _now(self.origin))
            await waiting

    async def _wait_commit(self, wait: CommitWait, key: Any) -> None:
        try:
            result = await self.kp.aio.wait_committed(self.group, {key: wait.target}, COMMIT_TIMEOUT_MS)
            if result.succeeded:
                wait.status = "committed"
            elif result.unavailable:
                wait.status = "unavailable"
            else:
                wait.status = "timed out"
        except Exception as exc:
            wait.status = type(exc).__name__
        finally:
            wait.elapsed_s = _now(self.origin) - wait.started_s

    async def _requester(self, index: int) -> None:
        from purgatory.adapters.kafka import RequestTimeoutError

        n = 0
        while not self.stop.is_set():
            n += 1
            call = RequestCall(f"s{self.runner.seed}-q{index}-{n}".encode(), RR_TIMEOUT_MS, _now(self.origin))
            self.history.requests.append(call)
            try:
                result = await self.kp.aio.request(self.rr_topic, call.value, timeout_ms=RR_TIMEOUT_MS)
                call.status, call.reply = "reply", result.value
            except RequestTimeoutError:
                call.status = "timed out"
            except Exception as exc:
                call.status = type(exc).__name__
            finally:
                call.elapsed_s = _now(self.origin) - call.started_s
            if call.status != "reply":
                await self._pause_after_error()


class _Committer:
    """Commits the commit waits' offsets with a plain consumer, in order, on one thread.

    One thread, in order: commits run concurrently could land out of order (a commit stuck on a
    frozen coordinator landing after a later one) and move the group's offset back, which is
    the committer's doing, not the service's. A synchronous commit to a frozen coordinator may
    block for librdkafka's socket timeout; it holds only this daemon thread (the waits racing the
    commits behind it are bounded on their own and answer timed out). Each commit is recorded as
    issued when the call begins, with the load's clock (``now``).
    """

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "log_level": 0}
        )
        self.queue: queue.SimpleQueue[tuple[int, list[CommitIssue], Callable[[], float]] | None] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._run, name="chaos-committer", daemon=True)
        self.thread.start()

    def commit(self, offset: int, issued: list[CommitIssue], now: Callable[[], float]) -> None:
        self.queue.put((offset, issued, now))

    def _run(self) -> None:
        from confluent_kafka import TopicPartition

        while (item := self.queue.get()) is not None:
            offset, issued, now = item
            issued.append(CommitIssue(offset, now()))
            with contextlib.suppress(Exception):  # a failed commit: the wait answers timed out
                self.consumer.commit(offsets=[TopicPartition(self.topic, 0, offset)], asynchronous=False)

    def committed(self, timeout_s: float) -> int | None:
        """The group's committed offset, once the queued commits are done (or ``timeout_s``)."""
        from confluent_kafka import TopicPartition

        self.queue.put(None)
        self.thread.join(timeout_s)
        try:
            (tp,) = self.consumer.committed([TopicPartition(self.topic, 0)], timeout=timeout_s)
        except Exception:
            return None
        return tp.offset if tp.offset >= 0 else 0

    def close(self) -> None:
        self.queue.put(None)
        with contextlib.suppress(Exception):
            self.consumer.close()


def read_log(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = READ_BACK_S
) -> dict[int, list[tuple[int, str | None]]]:
    """Every record of ``topic`` below its high watermark, per partition, with a plain consumer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-readback",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 0,
        }
    )
    out: dict[int, list[tuple[int, str | None]]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for p in range(partitions):
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            records: list[tuple[int, str | None]] = []
            consumer.assign([TopicPartition(topic, p, 0)])
            while (records[-1][0] + 1 if records else 0) < high:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}-{p}: read {len(records)} records of {high} in {timeout_s} s")
                for m in consumer.consume(500, timeout=0.5):
                    offset = m.offset()
                    if m.error() is None and offset is not None:
                        value = m.value()
                        records.append((offset, value.decode() if value is not None else None))
            out[p] = records
    finally:
        consumer.close()
    return out


class ChaosRunner:
    """One seed on ``cluster`` (a started 3-node :class:`LocalKafkaCluster`), its own service."""

    def __init__(
        self, cluster: Any, seed: int, seconds: float, work_dir: Path, max_wait_ms: int = 3000
    ) -> None:
        self.cluster, self.seed, self.seconds, self.work_dir = cluster, seed, seconds, work_dir
        self.max_wait_ms = max_wait_ms
        self.bounds = Bounds(REQUEST_TIMEOUT_MS / 1000)
        self.schedule = draw_schedule(seed, seconds, tuple(sorted(cluster.nodes)))
        from purgatory.adapters.kafka.local import free_port

        self.service = ServiceChild(cluster.bootstrap_servers, free_port(), work_dir / f"service-{seed}.log")

    def run(self) -> SeedResult:
        from purgatory.adapters.kafka import KafkaPurgatory, responder
        from purgatory.adapters.kafka.settings import KafkaSettings

        from .kafka_faults import create_topic

        bootstrap = self.cluster.bootstrap_servers
        durable = {"min.insync.replicas": "2"}
        topic = create_topic(
            bootstrap, PARTITIONS, replication=3, config=durable, prefix=f"chaos-{self.seed}"
        )
        rr_topic = create_topic(bootstrap, 1, replication=3, config=durable, prefix=f"chaos-rr-{self.seed}")
        group = f"chaos-{self.seed}-{os.getpid()}-{time.monotonic_ns()}"
        settings = KafkaSettings(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)

        def echo_value(request: Any) -> bytes:
            return b"echo:" + (request.value or b"")

        echo = responder(rr_topic, group=f"{group}-echo")(echo_value)

        errors: list[str] = []
        nemesis: _Nemesis | None = None
        history = History()
        kp = KafkaPurgatory.connect(settings, name=f"chaos-{self.seed}")
        committer = _Committer(bootstrap, group, topic)
        echo.start(settings)
        try:
            # RF 3 like the request topic: the broker default (1) puts every reply on one node.
            kp.replies(f"{rr_topic}-replies", partitions=1, replication_factor=3)
            self.service.start()
            self.service.wait_ready()
            if not echo.assigned.wait(SERVICE_START_S):
                raise RuntimeError("the echo responder was never assigned its topic")
            # Request-reply's first request sets up the reply side (topic, group join, tail):
            # done healthy, before the clock starts, so the faults hit a working requester.
            warm = kp.request(rr_topic, b"warm", timeout_ms=WARM_UP_MS)
            if not warm.wait(WARM_UP_MS / 1000 + 10) or warm.result().value != b"echo:warm":
                raise RuntimeError("request-reply did not answer before the faults began")
            origin = time.monotonic()
            load = _Load(self, topic, rr_topic, group, kp, committer, origin)
            history = load.history
            nemesis = _Nemesis(self.schedule, self.cluster, self.service, origin)
            nemesis.start()
            try:
                asyncio.run(load.run(self.seconds))
            finally:
                nemesis.load_over.set()
                nemesis.join(HEAL_S + 30)
            if nemesis.error is not None:
                errors.append(f"a fault could not be run or healed: {nemesis.error!r}")
            self._heal()
            log = read_log(bootstrap, topic, PARTITIONS)
            committed = committer.committed(READ_BACK_S / 4)
            result = check(history, log, committed, self.bounds)
        except Exception as exc:
            errors.append(f"the run failed: {exc!r}")
            result = CheckResult([], {})
        finally:
            with contextlib.suppress(Exception):
                self._heal()
            self.service.stop()
            echo.stop()
            committer.close()
            kp.close()
        ran = nemesis.ran if nemesis else []
        return SeedResult(self.seed, self.seconds, self.schedule, ran, result, errors, self.service.pids)

    def _heal(self) -> None:
        """Every node running and unfrozen, the cluster answering, the service up."""
        for node_id, node in self.cluster.nodes.items():
            if node.state() == "paused":
                self.cluster.resume_broker(node_id)
            elif not node.is_running():
                self.cluster.start_broker(node_id, timeout_s=HEAL_S)
        self.cluster.wait_ready(HEAL_S, brokers=len(self.cluster.nodes))
        if not self.service.running():
            self.service.start()
            self.service.wait_ready()


def _print_seed(result: SeedResult, echo: Callable[[str], None], command: str) -> None:
    verdict = "ok" if result.ok else f"{len(result.result.violations) + len(result.errors)} VIOLATION(S)"
    faults = f"faults {len(result.ran)}/{len(result.schedule)}"
    echo(f"seed {result.seed}: {verdict}; {faults}; {result.result.summary()}")
    if result.ok:
        return
    for line in [*result.errors, *result.result.violations][:30]:
        echo(f"  ! {line}")
    echo("  schedule:")
    echo(format_schedule(result.schedule, result.ran))
    echo(f"  replay: {command} --seed {result.seed} --seconds {result.seconds:g}")


def run_seeds(
    seeds: list[int],
    seconds: float,
    *,
    cluster: Any = None,
    echo: Callable[[str], None] = print,
    work_dir: Path | None = None,
    command: str = "purgatory bench chaos",
) -> list[SeedResult]:
    """Run each seed on ``cluster`` (a 3-node local cluster started here and stopped at the end
    when not given); print a line per seed as it finishes."""
    from purgatory.adapters.kafka import LocalKafkaCluster

    own_cluster = cluster is None
    work = work_dir or Path(tempfile.mkdtemp(prefix="purgatory-chaos-"))
    results: list[SeedResult] = []
    with structlog.testing.capture_logs():  # the library's outage warnings: expected, not output
        if own_cluster:
            echo("starting a local 3-broker Kafka (three KRaft voters) ...")
            cluster = LocalKafkaCluster(brokers=3).start()
        try:
            for seed in seeds:
                result = ChaosRunner(cluster, seed, seconds, work).run()
                results.append(result)
                _print_seed(result, echo, command)
        finally:
            if own_cluster:
                cluster.stop()
    if all(r.ok for r in results) and work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        echo(f"service logs: {work}")
    return results


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def chaos(
    seeds: Annotated[int, typer.Option(min=1, help="How many seeds (from --first-seed on).")] = 5,
    first_seed: Annotated[int, typer.Option(help="The first seed.")] = 1,
    seed: Annotated[int | None, typer.Option(help="Run this one seed only (replay).")] = None,
    seconds: Annotated[float, typer.Option(min=5.0, help="Load (and faults) per seed, seconds.")] = 20.0,
) -> None:
    """Randomized faults (kill, pause, stop nodes; bounce the service) under mixed load, checked."""
    chosen = [seed] if seed is not None else list(range(first_seed, first_seed + seeds))
    # SIGTERM (a `timeout`, a CI runner) unwinds like Ctrl-C: the finally blocks stop the service
    # and the cluster by PID. Killed outright, a JVM in controlled shutdown without its quorum
    # outlived its parent.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    began = time.monotonic()
    results = run_seeds(chosen, seconds, echo=typer.echo)
    passed = sum(1 for r in results if r.ok)
    typer.echo(f"{passed} of {len(results)} seed(s) with 0 violations ({time.monotonic() - began:.0f} s)")
    if passed != len(results):
        raise typer.Exit(1)
