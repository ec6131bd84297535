"""Per-stage trace of request-reply round trips: where the time of a slow one goes (issue 14).

python -m purgatory.tools.bench.reply.trace --brokers 3 --rate 1000 --duration 10

Both topics use ``message.timestamp.type=LogAppendTime`` so every record carries the time its
leader appended it. Stages (wall clock, ms):

* t0 request() called                      (requester)
* ack request acknowledged (acks=all)      (hand-rolled only: its delivery report)
* t1 request appended on its leader        (the request's LogAppendTime, read by the responder)
* t2 responder handled the request         (handler)
* t3 reply appended on its leader          (the reply's LogAppendTime)
* t4 reply read by the requester's tail/consumer
* t5 request() returned
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from purgatory.adapters.kafka import (
    CORRELATION_ID,
    REPLY_PARTITION,
    REPLY_TOPIC,
    KafkaPurgatory,
    LocalKafkaCluster,
    Request,
    Responder,
    create_topic,
    encode_partition,
    header,
    headers_of,
)
from purgatory.adapters.kafka.local import STEADY_STATE_JVM_OPTIONS
from purgatory.adapters.kafka.settings import KafkaSettings

from ..measure import cpu_seconds_of, percentile, thread_times
from .request_reply import HAND_ROLLED_CLIENT, _freeze_start_up, _thaw

LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


def _responder_main(topic: str, group: str, bootstrap: str, linger_ms: str) -> None:
    import signal

    def handle(request: Request) -> bytes:
        body = json.loads(request.value or b"{}")
        # The topic's LogAppendTime: when the broker appended the request.
        body["t1"] = (request.timestamp_ms or 0) / 1000.0
        body["t2"] = time.time()
        return json.dumps(body).encode()

    echo = Responder(topic, handle, group=group, linger_ms=int(linger_ms))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    echo.start(KafkaSettings(bootstrap_servers=bootstrap))
    if not echo.assigned.wait(60):
        sys.exit("no assignment")
    print("ready", flush=True)
    stopping.wait()
    echo.stop()


def _create(bootstrap: str, topic: str, partitions: int, brokers: int, extra: dict[str, str]) -> None:
    config = {**LOG_APPEND, **({"min.insync.replicas": "2"} if brokers >= 3 else {}), **extra}
    create_topic(AdminClient({"bootstrap.servers": bootstrap}), topic, partitions=partitions,
                 replication_factor=brokers, config=config)  # fmt: skip


async def _paced(send: Any, rate: float, total: int) -> None:
    loop = asyncio.get_running_loop()
    tasks = set()
    start = loop.time()
    for i in range(total):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(send())
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)


def _ours(bootstrap: str, topic: str, brokers: int, rate: float, total: int, linger: int,
          topic_extra: dict[str, str]) -> list[dict[str, float]]:  # fmt: skip
    reply_topic = f"trace-replies-{uuid.uuid4().hex[:8]}"
    _create(bootstrap, reply_topic, 2, brokers, topic_extra)
    kp = KafkaPurgatory.connect(KafkaSettings(bootstrap_servers=bootstrap), name="trace", metrics=False)
    router = kp.replies(reply_topic, partitions=2, replication_factor=brokers, linger_ms=linger)
    seen: dict[str, tuple[float, float]] = {}
    original = router._on_records

    def on_records(key: Any, records: Any) -> None:
        now = time.time()
        for rec in records:
            raw = header(rec.headers, CORRELATION_ID)
            if raw is not None:
                seen[raw.decode()] = (rec.timestamp_ms / 1000.0, now)
        original(key, records)

    router._on_records = on_records
    router.tail._on_records = on_records
    rows: list[dict[str, float]] = []

    async def drive() -> None:
        aio = kp.aio
        await aio.request(topic, json.dumps({"t0": time.time()}).encode(), timeout_ms=30_000)
        _freeze_start_up()

        async def one() -> None:
            t0 = time.time()
            result = await aio.request(topic, json.dumps({"t0": t0}).encode(), timeout_ms=5000)
            t5 = time.time()
            body = json.loads(result.value)
            t3, t4 = seen.pop(result.correlation_id, (float("nan"), float("nan")))
            rows.append({"t0": t0, "t1": body["t1"], "t2": body["t2"], "t3": t3, "t4": t4, "t5": t5})

        await _measured(one, rate, total)

    try:
        asyncio.run(drive())
    finally:
        _thaw()
        kp.close()
    return rows


def _hand(bootstrap: str, topic: str, brokers: int, rate: float, total: int, linger: int,
          topic_extra: dict[str, str]) -> list[dict[str, float]]:  # fmt: skip
    reply_topic = f"trace-replies-{uuid.uuid4().hex[:8]}"
    _create(bootstrap, reply_topic, 2, brokers, topic_extra)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger, "enable.idempotence": True,
                         **HAND_ROLLED_CLIENT})  # fmt: skip
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"h-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                         **HAND_ROLLED_CLIENT})  # fmt: skip
    consumer.assign([TopicPartition(reply_topic, 0, OFFSET_END)])
    waiting: dict[bytes, tuple[asyncio.Future[Any], dict[str, float]]] = {}
    stopping = threading.Event()
    positioned = threading.Event()
    loop_box: list[asyncio.AbstractEventLoop] = []

    def consume() -> None:
        while not stopping.is_set():
            m = consumer.poll(0.1)
            tp = TopicPartition(reply_topic, 0)
            if not positioned.is_set() and consumer.get_watermark_offsets(tp, cached=True)[1] >= 0:
                positioned.set()
            if m is None or m.error() is not None:
                continue
            now = time.time()
            c = header(headers_of(m.headers()), CORRELATION_ID) or b""
            entry = waiting.pop(c, None)
            if entry is not None:
                entry[1]["t3"] = m.timestamp()[1] / 1000.0
                entry[1]["t4"] = now
                loop_box[0].call_soon_threadsafe(_set, entry[0], m.value())

    def pump() -> None:
        while not stopping.is_set():
            producer.poll(0.05)

    rows: list[dict[str, float]] = []

    async def drive() -> None:
        loop_box.append(asyncio.get_running_loop())
        threading.Thread(target=consume, daemon=True).start()
        threading.Thread(target=pump, daemon=True).start()
        positioned.wait(30)
        _freeze_start_up()

        async def one() -> None:
            t0 = time.time()
            c = uuid.uuid4().hex.encode()
            fut = loop_box[0].create_future()
            row: dict[str, float] = {"t0": t0}
            waiting[c] = (fut, row)

            def acked(err: Any, msg: Any) -> None:
                row["ack"] = time.time()

            producer.produce(topic, json.dumps({"t0": t0}).encode(), on_delivery=acked,
                             headers=[(CORRELATION_ID, c), (REPLY_TOPIC, reply_topic.encode()),
                                      (REPLY_PARTITION, encode_partition(0))])  # fmt: skip
            value = await asyncio.wait_for(fut, 5)
            row["t5"] = time.time()
            body = json.loads(value)
            row["t1"], row["t2"] = body["t1"], body["t2"]
            rows.append(row)

        await _measured(one, rate, total)

    try:
        asyncio.run(drive())
    finally:
        _thaw()
        stopping.set()
        consumer.close()
        producer.flush(10)
    return rows


async def _measured(one: Callable[[], Awaitable[None]], rate: float, total: int) -> None:
    """The measured phase, alike for both sides: thread CPU marks around the paced requests
    and the requester's GC pauses during them."""
    _MARKS.append(_threads())
    with _GcPauses() as pauses:
        await _paced(one, rate, total)
    _MARKS.append(_threads())
    print(f"  requester GC: {pauses.summary()}", flush=True)


def _set(fut: asyncio.Future[Any], v: Any) -> None:
    if not fut.done():
        fut.set_result(v)


def _pct(xs: list[float], p: float) -> float:
    return percentile([x for x in xs if x == x], p)  # NaN (a stage not stamped) left out


def _summary(name: str, rows: list[dict[str, float]], skip: int) -> dict[str, Any]:
    rows = rows[skip:] if len(rows) > skip else rows
    stages = [("ack", "t0", "ack"), ("t0>t1 req appended", "t0", "t1"), ("t1>t2 responder read", "t1", "t2"),
              ("t2>t3 reply appended", "t2", "t3"), ("t3>t4 reply read", "t3", "t4"),
              ("t4>t5 finished", "t4", "t5"), ("total", "t0", "t5")]  # fmt: skip
    out: dict[str, Any] = {}
    line = [f"{name:<5} n={len(rows)}"]
    for label, a, b in stages:
        d = [(r[b] - r[a]) * 1000 for r in rows if a in r and b in r]
        if not d:
            continue
        out[label] = (_pct(d, 0.5), _pct(d, 0.99))
        line.append(f"{label}: p50 {out[label][0]:.1f} p99 {out[label][1]:.1f}")
    print("\n   ".join(line), flush=True)
    # Slow requests: which stage holds most of their time
    slow = sorted(rows, key=lambda r: r["t5"] - r["t0"])[-max(1, len(rows) // 100) :]
    share: dict[str, float] = {}
    for r in slow:
        for label, a, b in stages[1:-1]:
            if a in r and b in r:
                share[label] = share.get(label, 0.0) + (r[b] - r[a]) * 1000 / len(slow)
    print("   slowest 1% mean per stage: " + ", ".join(f"{k} {v:.1f}" for k, v in share.items()), flush=True)
    return out


_MARKS: list[dict[str, tuple[float, int]]] = []


class _GcPauses:
    def __init__(self) -> None:
        self.pauses: list[tuple[float, int]] = []
        self._t = 0.0

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        import time as t

        if phase == "start":
            self._t = t.perf_counter()
        else:
            self.pauses.append(((t.perf_counter() - self._t) * 1000, int(info["generation"])))

    def __enter__(self) -> _GcPauses:
        import gc

        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *_: Any) -> None:
        import gc

        gc.callbacks.remove(self._cb)

    def summary(self) -> str:
        by = [sum(1 for _, g in self.pauses if g == k) for k in range(3)]
        top = sorted(self.pauses, reverse=True)[:5]
        total = sum(p for p, _ in self.pauses)
        return f"counts {by}, total {total:.0f} ms, top {[(round(p), g) for p, g in top]}"


def _threads() -> dict[str, tuple[float, int]]:
    """This process's threads: name -> (CPU seconds, context switches) so far."""
    import threading as th

    names = {t.native_id: t.name for t in th.enumerate()}
    out: dict[str, tuple[float, int]] = {}
    for thread in thread_times(os.getpid()):
        name = names.get(thread.tid, thread.name)
        old = out.get(name, (0.0, 0))
        out[name] = (old[0] + thread.cpu_s, old[1] + thread.switches)
    return out


def _jstat(pid: int) -> tuple[float, float, float, float]:
    """(young GCs, their seconds, full GCs, their seconds) of a JVM so far (JDK's jstat)."""
    out = subprocess.run(["jstat", "-gc", str(pid)], capture_output=True, text=True).stdout.split("\n")
    row = dict(zip(out[0].split(), out[1].split(), strict=False))
    return float(row["YGC"]), float(row["YGCT"]), float(row["FGC"]), float(row["FGCT"])


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--linger", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--broker-config", default="{}", help="JSON of extra broker settings")
    ap.add_argument("--topic-config", default="{}", help="JSON of extra topic settings")
    ap.add_argument("--jit", default="full")
    ap.add_argument("--jvm-extra", default="", help="extra JVM options, space separated")
    args = ap.parse_args()
    from purgatory.adapters.kafka.local import FAST_START_JVM_OPTIONS

    jvm = STEADY_STATE_JVM_OPTIONS if args.jit == "full" else FAST_START_JVM_OPTIONS
    jvm = (*jvm, *args.jvm_extra.split())
    extra = json.loads(args.broker_config)
    topic_extra = json.loads(args.topic_config)
    with LocalKafkaCluster(brokers=args.brokers, jvm_options=jvm, broker_config=extra) as cluster:
        bootstrap = cluster.bootstrap_servers
        pids = [n.pid for n in cluster.nodes.values() if n.pid is not None]
        topic = f"trace-requests-{uuid.uuid4().hex[:8]}"
        _create(bootstrap, topic, 1, args.brokers, topic_extra)
        proc = subprocess.Popen(
            [sys.executable, "-m", "purgatory.tools.bench.reply.trace", "responder",
             topic, "trace-echo", bootstrap, str(args.linger)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PURGATORY_LOG__LEVEL": "WARNING"},
        )  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "ready":
                break
            print("responder:", line.rstrip(), flush=True)
        try:
            warm = int(args.warmup * args.rate)
            _hand(bootstrap, topic, args.brokers, args.rate, warm, args.linger, topic_extra)
            total = int((args.duration + 2) * args.rate)
            for i in range(args.repeats):
                for side in ("ours", "hand") if i % 2 == 0 else ("hand", "ours"):
                    c0, r0, t0 = (
                        [cpu_seconds_of([p]) for p in pids],
                        cpu_seconds_of([proc.pid]),
                        time.process_time(),
                    )
                    gc0 = [_jstat(p) for p in pids]
                    fn = _ours if side == "ours" else _hand
                    _MARKS.clear()
                    rows = fn(bootstrap, topic, args.brokers, args.rate, total, args.linger, topic_extra)
                    th0, th1 = _MARKS
                    busy = sorted(((v[0] - th0.get(k, (0.0, 0))[0], v[1] - th0.get(k, (0.0, 0))[1], k)
                                   for k, v in th1.items()), reverse=True)[:8]  # fmt: skip
                    print("  threads (cpu s, switches): " + "; ".join(f"{k} {c:.2f} {n}" for c, n, k in busy))
                    cpu = [(cpu_seconds_of([p]) - c) / total * 1e6 for p, c in zip(pids, c0, strict=True)]
                    for p, g0 in zip(pids, gc0, strict=True):
                        g1 = _jstat(p)
                        print(
                            f"  broker {p}: young GCs {g1[0] - g0[0]:.0f} "
                            f"taking {1000 * (g1[1] - g0[1]):.0f} ms, "
                            f"full {g1[2] - g0[2]:.0f} taking {1000 * (g1[3] - g0[3]):.0f} ms",
                            flush=True,
                        )
                    print(f"run {i + 1} {side}: load {os.getloadavg()[0]:.1f}; cpu us/req requester "
                          f"{(time.process_time() - t0) / total * 1e6:.0f} responder "
                          f"{(cpu_seconds_of([proc.pid]) - r0) / total * 1e6:.0f} brokers "
                          + " ".join(f"{c:.0f}" for c in cpu), flush=True)  # fmt: skip
                    _summary(side, rows, int(2 * args.rate))
                    Path(f"/tmp/rr-trace-{side}-{i}.json").write_text(json.dumps(rows))
        finally:
            proc.terminate()
            proc.wait(20)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "responder":
        _responder_main(*sys.argv[2:])
    else:
        main()
