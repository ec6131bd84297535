"""``purgatory bench produce``: what ``kp.produce`` costs with and without the read-back.

:class:`DelayedProduce` answers ``NONE`` only after reading each partition's first and last
appended record back (a deposed leader's append, see :class:`FencedAppender`). This bench
measures that cost on a local Apache Kafka (the project's launcher, 127.0.0.1, stopped by PID at
the end; or the cluster ``PURGATORY_KAFKA_BOOTSTRAP`` names, for 1 broker), per feed mode
(``push``, ``poll``):

* **sequential**: ``kp.produce([record])`` then ``op.wait`` on one thread, one record at a time
  (each produce alone on its partition: the worst case for sharing reads), p50 / p99 latency;
* **burst**: ``burst`` produces from ``threads`` threads at once, completed per second.

Each workload runs twice in the same run, alternating which goes first: ``read-back`` (the
library as shipped) and ``no read-back`` (the baseline: the appender hands ``DelayedProduce`` no
reader, so only the epoch fences — a switch of this bench's own, no setting offers it). Topic:
``partitions`` partitions, replication factor = brokers; records carry no partition (the
producer spreads them). Printed: medians over ``--repeats`` and the same-run ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from purgatory.settings import KafkaSettings, load_settings

from ._admin import create_topic
from ._clients import ProducerRecord
from ._provider import provide_cluster
from ._service import KafkaPurgatory

__all__ = ["ProduceRun", "produce", "run_once"]

WAIT_S = 30.0  # one produce's answer; far above any figure measured
WARMUP_PRODUCES = 20  # connections, metadata, the first fetches: not measured


@dataclass(frozen=True)
class ProduceRun:
    """One run of one configuration (module docstring)."""

    mode: str  # "push" | "poll"
    read_back: bool
    brokers: int
    sequential: int
    seq_p50_ms: float
    seq_p99_ms: float
    burst: int
    burst_per_s: float
    failed: int  # produces not answered NONE (none expected on a healthy cluster)
    kafka_reads: int  # read-backs that went to Kafka (the read-back reader's counter)
    shared_hits: int  # read-backs answered from the tail's records


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@contextmanager
def _purgatory(settings: KafkaSettings, mode: str, read_back: bool) -> Iterator[KafkaPurgatory]:
    kafka = settings.model_copy(update={"feed_mode": mode})
    with KafkaPurgatory.connect(kafka, name=f"bench-produce-{mode}", configure_logging=False) as kp:
        if not read_back:
            # The bench's baseline: an appender without a reader returns no record identities, so
            # DelayedProduce fences by epoch alone (the library before the read-back).
            kp.appender.reader = None
        yield kp


def _produce_one(kp: KafkaPurgatory, topic: str, i: int) -> bool:
    op = kp.produce([ProducerRecord(topic, b"bench-%d" % i, key=b"%d" % i)])
    return op.wait(WAIT_S) and op.succeeded


def run_once(
    settings: KafkaSettings,
    topic: str,
    *,
    mode: str,
    read_back: bool,
    brokers: int,
    sequential: int,
    burst: int,
    threads: int,
) -> ProduceRun:
    """One configuration's sequential and burst workloads (module docstring)."""
    with _purgatory(settings, mode, read_back) as kp:
        failed = 0
        for i in range(WARMUP_PRODUCES):
            failed += not _produce_one(kp, topic, i)
        latencies = []
        for i in range(sequential):
            started = time.perf_counter()
            failed += not _produce_one(kp, topic, i)
            latencies.append((time.perf_counter() - started) * 1000.0)
        counter = iter(range(burst))
        counter_lock = threading.Lock()
        failures = [0] * threads

        def worker(slot: int) -> None:
            while True:
                with counter_lock:
                    i = next(counter, None)
                if i is None:
                    return
                failures[slot] += not _produce_one(kp, topic, i)

        workers = [
            threading.Thread(target=worker, args=(n,), name=f"bench-produce-{n}") for n in range(threads)
        ]
        started = time.perf_counter()
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        elapsed = time.perf_counter() - started
        reader = kp.appender.reader
        return ProduceRun(
            mode=mode,
            read_back=read_back,
            brokers=brokers,
            sequential=sequential,
            seq_p50_ms=statistics.median(latencies),
            seq_p99_ms=_pct(latencies, 0.99),
            burst=burst,
            burst_per_s=burst / elapsed,
            failed=failed + sum(failures),
            kafka_reads=getattr(reader, "kafka_reads", 0),
            shared_hits=getattr(reader, "shared_hits", 0),
        )


def _median(runs: list[ProduceRun], field: str) -> float:
    return statistics.median(float(getattr(r, field)) for r in runs)


def produce(
    brokers: Annotated[
        list[int] | None, typer.Option("--brokers", help="Broker counts (default 1; 3: a local cluster).")
    ] = None,
    modes: Annotated[
        list[str] | None, typer.Option("--mode", help="Feed modes (default push and poll).")
    ] = None,
    sequential: Annotated[int, typer.Option(min=1, help="Sequential produces per run.")] = 200,
    burst: Annotated[int, typer.Option(min=1, help="Produces per burst.")] = 800,
    threads: Annotated[int, typer.Option(min=1, help="Threads producing the burst.")] = 16,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the bench topic.")] = 4,
    repeats: Annotated[
        int, typer.Option("--repeats", "-r", min=1, help="Runs per configuration (medians).")
    ] = 3,
    out: Annotated[Path, typer.Option(help="Directory for the JSON result file.")] = Path("bench-results"),
) -> None:
    """kp.produce latency and throughput with the read-back, vs without it in the same run."""
    settings = load_settings().kafka
    all_runs: list[ProduceRun] = []
    for count in brokers or [1]:
        with provide_cluster(settings, brokers=count) as cluster:
            kafka = settings.model_copy(update={"bootstrap_servers": cluster.bootstrap_servers})
            topic = f"bench-produce-{uuid.uuid4().hex[:8]}"
            with KafkaPurgatory.connect(kafka, configure_logging=False, metrics=False) as admin:
                create_topic(
                    admin.view.admin, topic, partitions=partitions, replication_factor=count, timeout_s=30.0
                )
                ready = admin.topic_ready(topic, 30_000)
                if not (ready.wait(35.0) and ready.ready):
                    raise RuntimeError(f"bench topic {topic} has no leaders after 30 s")
            typer.echo(
                f"{count} broker(s) via {cluster.provider} at {cluster.bootstrap_servers}, load "
                f"{os.getloadavg()[0]:.1f}: {sequential} sequential + {burst} from {threads} threads, "
                f"{partitions} partitions, x{repeats}"
            )
            typer.echo(
                f"{'mode':>5} {'read-back':>9} {'seq p50':>8} {'seq p99':>8} {'burst/s':>8} "
                f"{'failed':>6} {'kafka reads':>11} {'cache hits':>10}"
            )
            for mode in modes or ["push", "poll"]:
                runs: dict[bool, list[ProduceRun]] = {True: [], False: []}
                for repeat in range(repeats):
                    order = (True, False) if repeat % 2 == 0 else (False, True)
                    for read_back in order:
                        runs[read_back].append(
                            run_once(
                                kafka,
                                topic,
                                mode=mode,
                                read_back=read_back,
                                brokers=count,
                                sequential=sequential,
                                burst=burst,
                                threads=threads,
                            )
                        )
                for read_back in (True, False):
                    rs = runs[read_back]
                    typer.echo(
                        f"{mode:>5} {'yes' if read_back else 'no':>9} {_median(rs, 'seq_p50_ms'):>6.2f}ms "
                        f"{_median(rs, 'seq_p99_ms'):>6.1f}ms {_median(rs, 'burst_per_s'):>8.0f} "
                        f"{sum(r.failed for r in rs):>6} {_median(rs, 'kafka_reads'):>11.0f} "
                        f"{_median(rs, 'shared_hits'):>10.0f}"
                    )
                    all_runs.extend(rs)
                p50_ratios = [
                    a.seq_p50_ms / b.seq_p50_ms for a, b in zip(runs[True], runs[False], strict=True)
                ]
                burst_ratios = [
                    a.burst_per_s / b.burst_per_s for a, b in zip(runs[True], runs[False], strict=True)
                ]
                typer.echo(
                    f"{mode:>5} read-back / baseline, same-run medians: sequential p50 x"
                    f"{statistics.median(p50_ratios):.2f} (target <= 1.20 in push), burst x"
                    f"{statistics.median(burst_ratios):.2f}"
                )
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"produce-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps([asdict(r) for r in all_runs], indent=2))
    typer.echo(f"runs written to {path}")
