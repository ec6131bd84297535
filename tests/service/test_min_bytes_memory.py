"""Large-``min_bytes`` long polls keep the service's memory bounded (the memory-runaway report).

The report: 1,000 long polls ``min_bytes=16000000&max_bytes=16777216`` on one partition, then
200 records of 100 KB produced in batches of 10 — the service passed 3 GB of RSS within seconds
and stopped answering ``/healthz``. Each waiter's answer (~21 MB of JSON) ended up copied into its
own connection's transport buffer. Scaled down here (200 waiters, 100 records of 100 KB: each
answer ~13 MB, the unfixed service grew past 1 GB) against real Kafka and the service's real
server in its own process (``python -m purgatory.adapters.service.serve``, as deployed), so its
RSS is the service's alone: clients that never read, clients that read, and h2c streams.
"""

from __future__ import annotations

import pytest
from purgatory.tools.bench.service.min_bytes_flood import flood

WAITERS = 200
RECORDS = 100  # 10 MB in all: under min_bytes, so every poll is answered at its max_wait_ms
RECORD_BYTES = 100_000
# The fixed service grew ~50-110 MB here (and at the report's full 1,000 waiters); unfixed, past
# 1 GB. The service is killed past RSS_CAP_MB: a regression must not take the machine's memory.
MAX_GROWTH_MB = 400
RSS_CAP_MB = 1_500


@pytest.mark.parametrize("mode", ["idle", "read", "h2"])
def test_large_min_bytes_long_polls_keep_rss_bounded_and_the_service_answering(
    mode: str, kafka_bootstrap: str
) -> None:
    result = flood(
        mode=mode,
        waiters=WAITERS,
        records=RECORDS,
        record_bytes=RECORD_BYTES,
        rss_cap_mb=RSS_CAP_MB,
        bootstrap=kafka_bootstrap,
    )
    assert not result.killed_at_cap, f"the service grew past {RSS_CAP_MB} MB and was killed: {result}"
    assert result.registered == WAITERS, f"every long poll waits before the produces: {result}"
    assert result.rss_peak_above_start_mb < MAX_GROWTH_MB, (
        f"RSS grew {result.rss_peak_above_start_mb:.0f} MB (bound {MAX_GROWTH_MB}): answers shared, "
        f"never one copy per waiter: {result}"
    )
    assert result.produces_ok == RECORDS // 10 and not result.produces_failed, (
        f"every produce answered: {result}"
    )
    assert result.health_failures == 0, f"/healthz answered within 2 s throughout: {result}"
    if mode != "idle":
        assert result.answer_statuses == {"200": WAITERS}, f"every reading client got its answer: {result}"


# The back-pressure report: one HTTP/1.1 connection pipelines 100 long polls with max_bytes
# 4,000,000 on a partition holding data and never reads (4 KB receive buffer): the service grew
# +296 MB (its answers written whole into the transport). After the fix: +23-28 MB measured from a
# warmed service, +75-80 MB here from a cold one (its first long poll went through the ASGI path,
# whose body h11 and the transport copied whole); +25 MB since that path writes a large answer
# piece by piece (the cold round of the test below). The bound guards against the regression.
PIPELINED = 100
PIPELINED_MAX_GROWTH_MB = 150


def test_pipelined_large_answers_to_a_client_that_never_reads_keep_rss_bounded(kafka_bootstrap: str) -> None:
    import socket
    import time
    import uuid

    from confluent_kafka import Producer
    from purgatory.adapters.kafka.local import free_port
    from purgatory.tools.bench.measure import rss_bytes
    from purgatory.tools.bench.service.fanout import ServiceProcess

    from tests.kafka.kafka_fixtures import create_topic

    topic = create_topic(kafka_bootstrap, f"pipelined-{uuid.uuid4().hex[:8]}", 1, 1, None)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "log_level": 0})
    for i in range(60):  # 6 MB: every answer is a full 4 MB
        producer.produce(topic, bytes([i % 251]) * RECORD_BYTES, partition=0)
    assert producer.flush(30) == 0
    service = ServiceProcess(kafka_bootstrap, free_port())
    try:
        service.wait_ready()
        start = rss_bytes(service.pid)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", int(service.url.rsplit(":", 1)[1])))
        request = (
            f"GET /topics/{topic}/partitions/0/records?offset=0&max_bytes=4000000&max_wait_ms=1000 "
            "HTTP/1.1\r\nHost: t\r\n\r\n"
        ).encode()
        try:
            client.sendall(request * PIPELINED)
            peak = 0
            # The service's answer to a client that never reads has no event to wait on: RSS is
            # sampled for a bounded window (each poll's max_wait_ms is 1 s; all are due by then).
            deadline = time.monotonic() + 8.0
            while time.monotonic() < deadline:
                peak = max(peak, rss_bytes(service.pid) - start)
                time.sleep(0.05)
        finally:
            client.close()
        assert peak / 1e6 < PIPELINED_MAX_GROWTH_MB, f"RSS grew {peak / 1e6:.0f} MB for one unread connection"
    finally:
        service.stop()


# The same replay over h2c (issue 31, item 6): 100 streams on one connection whose client opened
# its windows to 2^31-1 and never reads. Unfixed: +381 MB in the report, past 1 GB here (a cold
# service's bridged answers were two copies per stream, an answer's JSON past 16 MiB a 500 per
# stream, and no budget bounded distinct answers held). Measured after a warm-up round
# (tools/bench/service/unread_answers.py): once every round re-read the range from Kafka (the
# change feed's tail replaced the record cache's span) and rendered its ~18 MB of JSON again
# while the previous body was still kept: peaks +48-83 MB. With the range served from the cache
# (one shared answer, one body), every round of 3 invocations: h2 +1-5 MB, HTTP/1.1 +18-21 MB
# (docs/operations/limits.md). Both bounds are the issue's own (under 50 MB above the start,
# within 10 MB after the close); the peak is the largest of the rounds, more than twice the
# largest measured.
#
# The cold round (the first after the service started) once kept +43 MB (HTTP/1.1) and +27 MB
# (h2c) for good after the close: the ~18 MB body as the last rendered answer, the HTTP/1.1 fast
# path's copy of head + body, and glibc's heap holding freed large blocks (its mmap threshold
# rises after the first large free). Now a released body leaves the caches, large blocks are
# mapped and unmapped, and bodies render a group of records at a time: 3 invocations (load
# average 3.5-5.8 on 2 shared cores): HTTP/1.1 peak +24.9-25.2 MB, after the close +5.4-6.0 MB;
# h2c +26.8-32.2 MB, +6.9-8.6 MB; every round re-renders its body now (warm peaks +18-25 MB). Of
# what stays, 4.0 MB is the record cache's span of the range (a bounded cache, by design:
# docs/operations/limits.md), reported by the service and left out of the after-close check:
# without it +1.4-4.6 MB against the 10 (its raw figures sit too close to 10 MB for a
# test on a loaded CI). The cold peak bound is the 50 MB: ~1.5x the largest measured.
UNREAD_ROUNDS = 3
UNREAD_PEAK_MB = 50
UNREAD_AFTER_CLOSE_MB = 10


@pytest.mark.parametrize("protocol", ["h2", "h1"])
def test_unread_large_answers_stay_bounded_and_are_freed_after_the_close(
    protocol: str, kafka_bootstrap: str
) -> None:
    import statistics

    from purgatory.tools.bench.service.unread_answers import replay

    every = replay(kafka_bootstrap, protocol, rounds=UNREAD_ROUNDS)
    (cold,) = [r for r in every if r.cold]
    results = [r for r in every if not r.cold]
    peak = max(r.peak_above_start_mb for r in results)
    after = statistics.median(r.after_close_above_start_mb for r in results)
    assert peak < UNREAD_PEAK_MB, f"RSS grew too much while unread: {results}"
    assert after < UNREAD_AFTER_CLOSE_MB, f"RSS stayed up after the close: {results}"
    assert cold.peak_above_start_mb < UNREAD_PEAK_MB, f"a cold service's first round grew too much: {cold}"
    assert cold.after_close_without_record_cache_mb < UNREAD_AFTER_CLOSE_MB, (
        f"a cold service's first round left memory behind beyond its record cache: {cold}"
    )


def test_long_polls_past_the_answer_budget_are_answered_429_memory_budget_exceeded(
    kafka_bootstrap: str,
) -> None:
    """One unread connection holds a 4 MB answer; with a 1 MB budget a new long poll hears 429."""
    import socket
    import time

    import httpx
    from purgatory.adapters.kafka.local import free_port
    from purgatory.tools.bench.service.fanout import ServiceProcess
    from purgatory.tools.bench.service.unread_answers import _fill_partition, _h1_requests

    topic = _fill_partition(kafka_bootstrap)
    port = free_port()
    service = ServiceProcess(
        kafka_bootstrap, port, env={"PURGATORY_SERVICE__ANSWER_BUDGET_BYTES": str(1024 * 1024)}
    )
    try:
        service.wait_ready()
        url = f"http://127.0.0.1:{port}/topics/{topic}/partitions/0/records"
        small = httpx.get(url, params={"offset": 0, "max_bytes": 1000, "max_wait_ms": 100}, timeout=10)
        assert small.status_code == 200, f"small answers are not held: {small.text}"
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            client.connect(("127.0.0.1", port))
            client.sendall(_h1_requests(topic))
            deadline = time.monotonic() + 20.0
            refused = None
            while time.monotonic() < deadline:  # until the unread answer is being written (held)
                answer = httpx.get(url, params={"offset": 0, "max_wait_ms": 100}, timeout=10)
                if answer.status_code == 429:
                    refused = answer
                    break
                time.sleep(0.1)
            assert refused is not None, "a long poll past the answer budget is refused"
            assert refused.json()["error"] == "MEMORY_BUDGET_EXCEEDED"
            assert refused.headers["retry-after"].isdigit()
        finally:
            client.close()
        deadline = time.monotonic() + 20.0
        status = 0
        while time.monotonic() < deadline and status != 200:  # the closed connection gave it back
            status = httpx.get(
                url, params={"offset": 0, "max_bytes": 1000, "max_wait_ms": 100}, timeout=10
            ).status_code
            time.sleep(0.1)
        assert status == 200, "the budget is given back once the unread connection closed"
    finally:
        service.stop()


# The same attack with waiters that are not equal (issue 31, item 1's last part): each asks a
# different min_bytes near the 16 MiB limit, so each is its own operation (equal long polls share
# one: issue 30), gathering the records produced in batches. What they hold is counted once per
# read shared by them (service.gathered_budget_bytes, facts/_gathered.py); past the budget the
# waiters are answered at once with what they have — 200 with records, not a 5xx, not lost, long
# before their max_wait_ms. A 3 MiB budget here: three 1 MB batches fit, the fourth does not.
GATHER_WAITERS = 40
GATHER_BATCHES = 8  # 8 MB in all: under every waiter's min_bytes
GATHER_BUDGET = 3 * 1024 * 1024
GATHER_MAX_WAIT_MS = 30_000


def _metric(url: str, name: str) -> float:
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_distinct_min_bytes_waiters_are_answered_early_past_the_gathered_budget(kafka_bootstrap: str) -> None:
    import asyncio
    import time
    import uuid

    import httpx
    from confluent_kafka import Producer
    from purgatory.adapters.kafka.local import free_port
    from purgatory.tools.bench.service.fanout import ServiceProcess, long_polls_waiting

    from tests.kafka.kafka_fixtures import create_topic

    topic = create_topic(kafka_bootstrap, f"gathered-{uuid.uuid4().hex[:8]}", 1, 1, None)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "log_level": 0})
    producer.produce(topic, b"written-before", partition=0)  # the polls wait at offset 1
    assert producer.flush(30) == 0
    port = free_port()
    service = ServiceProcess(
        kafka_bootstrap, port, env={"PURGATORY_SERVICE__GATHERED_BUDGET_BYTES": str(GATHER_BUDGET)}
    )
    url = f"http://127.0.0.1:{port}"
    peaks: list[float] = []

    async def attack() -> tuple[list[httpx.Response], float]:
        limits = httpx.Limits(max_connections=GATHER_WAITERS + 1)
        async with httpx.AsyncClient(timeout=GATHER_MAX_WAIT_MS / 1000 + 30, limits=limits) as client:
            polls = [
                asyncio.create_task(
                    client.get(
                        f"{url}/topics/{topic}/partitions/0/records",
                        params={
                            "offset": 1,
                            "max_wait_ms": GATHER_MAX_WAIT_MS,
                            "min_bytes": 16_000_000 - i,
                            "max_bytes": 16 * 1024 * 1024,
                        },
                    )
                )
                for i in range(GATHER_WAITERS)
            ]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if long_polls_waiting((await client.get(f"{url}/healthz")).json()) == GATHER_WAITERS:
                    break
                await asyncio.sleep(0.1)
            produced_at = time.monotonic()
            for n in range(GATHER_BATCHES):
                for _ in range(10):
                    producer.produce(topic, b"v" * RECORD_BYTES, partition=0)
                assert producer.flush(30) == 0
                # Until the waiters read this batch (held, or answered early): batches apart.
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not all(p.done() for p in polls):
                    held = await asyncio.to_thread(_metric, url, "purgatory_service_gathered_bytes")
                    peaks.append(held)
                    if held >= (n + 1) * 10 * RECORD_BYTES or any(p.done() for p in polls):
                        break
                    await asyncio.sleep(0.05)
            answers = await asyncio.wait_for(asyncio.gather(*polls), GATHER_MAX_WAIT_MS / 1000 + 30)
            return answers, time.monotonic() - produced_at

    try:
        service.wait_ready()
        answers, seconds = asyncio.run(attack())
        statuses = sorted({a.status_code for a in answers})
        assert statuses == [200], f"every waiter answered 200 (not a 5xx, not lost): {statuses}"
        assert seconds < GATHER_MAX_WAIT_MS / 1000, f"answered early, not at max_wait_ms: {seconds:.1f} s"
        for answer in answers:
            records = answer.json()["records"]
            assert 0 < len(records) < GATHER_BATCHES * 10, "with the records it gathered, short of min_bytes"
        peak = _metric(url, "purgatory_service_gathered_peak_bytes")
        assert 0 < peak <= GATHER_BUDGET, f"gathered bytes within the budget: peak {peak}"
        assert max(peaks) <= GATHER_BUDGET
        assert _metric(url, "purgatory_service_gathered_early_answers_total") >= 1
        assert _metric(url, "purgatory_service_gathered_bytes") == 0, "given back once answered"
        print(
            f"gathered: peak {peak:.0f} B of {GATHER_BUDGET}, "
            f"{len(answers)} answered {seconds:.1f} s after the first produce"
        )
    finally:
        service.stop()
