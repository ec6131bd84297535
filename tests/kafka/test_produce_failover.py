"""Produce under a partition leader's crash (SIGKILL) and freeze (SIGSTOP), beside a plain producer.

Both sides run in the same process at the same time, so the same fault hits both: ours
(``AsyncKafkaPurgatory.produce``) and what a user writes without us — a confluent-kafka
``Producer`` with ``acks=all`` and ``enable.idempotence`` whose delivery reports are awaited as
asyncio futures. Each request writes three records: two to partition 0 and one to partition 1
(a request spanning partitions across the leader change; both partitions are led by the node the
fault hits). The fault comes once a third of the requests were answered (an event, not a time).

Afterwards the log is read back and, per side:

* every request the plain producer got through, ours got through (ours fails no more often);
* each request was answered within its timeout;
* 0 acknowledged records missing (each at the offset its answer gave), 0 records twice, and each
  request's records in order within a partition.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from purgatory.adapters.kafka import (
    ClusterView,
    KafkaPurgatory,
    LocalKafkaCluster,
    ProducerRecord,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.settings import KafkaSettings

from .conftest import WAIT_S, wait_until
from .kafka_fixtures import create_topic, wait_isr

pytestmark = pytest.mark.kafka

REQUESTS = 300  # per side
CONCURRENCY = 16  # per side
TIMEOUT_MS = 30_000  # each request's bound, both sides (the plain producer's message.timeout.ms)
ANSWER_SLACK_S = 3.0  # an answer is on time within its timeout plus this
FREEZE_S = 6.0  # past the launcher's broker session timeout: the frozen leader is replaced
KILL, FREEZE = "sigkill", "sigstop"


@dataclass
class Side:
    """One side's requests: what it was answered, per request, and how long that took."""

    name: str
    delivered: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # (partition, offset)
    failed: dict[int, str] = field(default_factory=dict)
    late: list[int] = field(default_factory=list)
    answered: int = 0


def _records(topic: str, side: str, request: int) -> list[tuple[str, int, bytes]]:
    return [(topic, p, f"{side}-{request}-{i}".encode()) for i, p in enumerate((0, 0, 1))]


class PlainProducer:
    """What a user writes without us: acks=all, idempotent, delivery reports as asyncio futures."""

    def __init__(self, bootstrap: str, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 1,
                "message.timeout.ms": TIMEOUT_MS,
                "log_level": 0,
            }
        )
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stopping.is_set():
            self.producer.poll(0.05)

    async def produce(self, records: list[tuple[str, int, bytes]]) -> list[Any]:
        futures = []
        for topic, partition, value in records:
            future: asyncio.Future[Any] = self.loop.create_future()

            def delivered(
                error: KafkaError | None, message: Message, f: asyncio.Future[Any] = future
            ) -> None:
                outcome = (error, message.partition(), message.offset())
                self.loop.call_soon_threadsafe(lambda: f.done() or f.set_result(outcome))

            self.producer.produce(topic, value, partition=partition, on_delivery=delivered)
            futures.append(future)
        return list(await asyncio.gather(*futures))

    def close(self) -> None:
        self.producer.flush(WAIT_S)
        self.stopping.set()
        self.thread.join(WAIT_S)


async def _run_side(
    side: Side, send: Any, topic: str, third: asyncio.Event, total_answered: list[int]
) -> None:
    queue = list(range(REQUESTS))

    async def worker() -> None:
        while queue:
            request = queue.pop()
            started = time.monotonic()
            try:
                ok, where, error = await send(_records(topic, side.name, request))
            except Exception as exc:  # a raise is an answer too: a failed request
                ok, where, error = False, [], repr(exc)
            if time.monotonic() - started > TIMEOUT_MS / 1000 + ANSWER_SLACK_S:
                side.late.append(request)
            if ok:
                side.delivered[request] = where
            else:
                side.failed[request] = error
            side.answered += 1
            total_answered[0] += 1
            if total_answered[0] >= 2 * REQUESTS // 3:
                third.set()

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def _read_log(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of partitions 0 and 1 below ``ends`` (offset, value), in offset order."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    for p in (0, 1):
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"readback-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        records: list[tuple[int, bytes]] = []
        try:
            consumer.assign([TopicPartition(topic, p, 0)])
            deadline = time.monotonic() + 60
            while (records[-1][0] + 1 if records else 0) < ends[p]:
                assert time.monotonic() < deadline, f"{topic}-{p} read to {len(records)} of {ends[p]}"
                for m in consumer.consume(500, timeout=0.5):
                    if m.error() is None:
                        records.append((m.offset(), m.value() or b""))
        finally:
            consumer.close()
        out[p] = records
    return out


def _check(side: Side, log: dict[int, list[tuple[int, bytes]]]) -> None:
    where: dict[bytes, list[tuple[int, int]]] = {}
    for partition, records in log.items():
        for offset, value in records:
            if value.startswith(f"{side.name}-".encode()):
                where.setdefault(value, []).append((partition, offset))
    twice = {v: w for v, w in where.items() if len(w) > 1}
    assert not twice, f"{side.name}: records in the log twice: {list(twice.items())[:5]}"
    for request, places in side.delivered.items():
        for i, (partition, offset) in enumerate(places):
            value = f"{side.name}-{request}-{i}".encode()
            assert where.get(value) == [(partition, offset)], (
                f"{side.name}: acknowledged {value!r} at {partition}:{offset}, the log has {where.get(value)}"
            )
    for request in range(REQUESTS):
        first = where.get(f"{side.name}-{request}-0".encode())
        second = where.get(f"{side.name}-{request}-1".encode())
        if first and second:
            assert first[0][1] < second[0][1], f"{side.name}: request {request}'s records reordered"
        if second and not first:
            # A later record of a request written without its earlier one: order broken.
            raise AssertionError(f"{side.name}: request {request}'s record 1 is in the log without record 0")


def _run(cluster: LocalKafkaCluster, leader: int, replicas: list[list[int]], fault: str) -> None:
    bootstrap = cluster.bootstrap_servers
    settings = KafkaSettings(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    topic = create_topic(
        bootstrap,
        f"failover-{fault}-{uuid.uuid4().hex[:6]}",
        replica_assignment=replicas,
        config={"min.insync.replicas": str(min(2, len(replicas[0])))},
    )
    for p in (0, 1):
        wait_isr(settings, TopicPartitionKey(topic, p), len(replicas[0]))
    ours, plain = Side("ours"), Side("plain")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        baseline = PlainProducer(bootstrap, loop)
        async with KafkaPurgatory.connect(settings, name=f"failover-{fault}") as kp:

            async def our_send(records: list[tuple[str, int, bytes]]) -> tuple[bool, Any, str]:
                result = await kp.produce(
                    [ProducerRecord(t, v, partition=p) for t, p, v in records], timeout_ms=TIMEOUT_MS
                )
                places = [(p, o) for (_, p, _), o in zip(records, result.offsets, strict=True)]
                return result.succeeded, places, f"{result.record_statuses} {result.error}"

            async def plain_send(records: list[tuple[str, int, bytes]]) -> tuple[bool, Any, str]:
                outcomes = await baseline.produce(records)
                errors = [e for e, _, _ in outcomes if e is not None]
                return not errors, [(p, o) for _, p, o in outcomes], str(errors)

            # Warm both: metadata known, connections open, before the measured requests.
            assert (await our_send(_records(topic, "warm", 0)))[0]
            assert (await plain_send(_records(topic, "warm", 1)))[0]
            third = asyncio.Event()
            answered = [0]
            load = asyncio.gather(
                _run_side(ours, our_send, topic, third, answered),
                _run_side(plain, plain_send, topic, third, answered),
            )

            async def inject() -> None:
                await third.wait()
                if fault == KILL:
                    cluster.kill_broker(leader)
                    # From a worker thread, which ends with the loop: the node must outlive it.
                    await asyncio.to_thread(cluster.start_broker, leader)
                else:
                    cluster.pause_broker(leader)
                    await asyncio.sleep(FREEZE_S)  # the fault's length: nothing to wait on, by design
                    cluster.resume_broker(leader)

            await asyncio.gather(load, inject())
        await asyncio.to_thread(baseline.close)

    try:
        asyncio.run(main())
        _verify(settings, topic, ours, plain, fault)
    finally:
        cluster.resume_broker(leader)
        if not cluster.node(leader).is_running():
            cluster.start_broker(leader)


def _verify(settings: KafkaSettings, topic: str, ours: Side, plain: Side, fault: str) -> None:
    bootstrap = settings.bootstrap_servers
    assert bootstrap is not None
    view = ClusterView(settings)
    try:
        wait_until(lambda: _ends(view, topic) is not None, "the partitions answer ListOffsets", 60.0)
        ends = _ends(view, topic)
        assert ends is not None
    finally:
        view.close()
    log = _read_log(bootstrap, topic, ends)
    print(
        f"{fault}: ours {len(ours.delivered)} delivered / {len(ours.failed)} failed, "
        f"plain {len(plain.delivered)} / {len(plain.failed)}"
    )
    for side in (ours, plain):
        assert side.answered == REQUESTS, f"{side.name}: {side.answered} of {REQUESTS} answered"
        assert not side.late, f"{side.name}: {len(side.late)} answered past their timeout"
        _check(side, log)
    assert len(ours.failed) <= len(plain.failed), (
        f"ours failed {len(ours.failed)} request(s), the plain producer {len(plain.failed)}: "
        f"{list(ours.failed.items())[:3]}"
    )


def _ends(view: ClusterView, topic: str) -> dict[int, int] | None:
    try:
        marks = view.high_watermarks([TopicPartitionKey(topic, p) for p in (0, 1)])
    except Exception:
        return None
    return {k.partition: v for k, v in marks.items()}


@pytest.mark.parametrize("fault", [KILL, FREEZE])
def test_produce_rides_out_the_leader_crashing_on_three_brokers_as_a_plain_producer_does(
    kafka_cluster3: LocalKafkaCluster, fault: str
) -> None:
    _run(kafka_cluster3, 2, [[2, 3, 1], [2, 1, 3]], fault)


@pytest.mark.parametrize("fault", [KILL, FREEZE])
def test_produce_rides_out_the_only_broker_crashing_as_a_plain_producer_does(
    kafka_cluster1: LocalKafkaCluster, fault: str
) -> None:
    _run(kafka_cluster1, 1, [[1], [1]], fault)
