"""``python -m purgatory.tools.bench.service.unread_answers``: large answers to a client that never reads.

The back-pressure report (issue 31, item 6): one connection asks for 100 long polls with
``max_bytes=4000000`` on a partition holding ~6 MB and never reads (a 4 KB receive buffer) —
HTTP/1.1 pipelined on one connection, or h2c as 100 streams on one connection whose client
announced flow-control windows of 2^31-1 (so flow control never holds an answer back). Unfixed,
the service grew +296 MB (HTTP/1.1) and +381 MB (h2c): whole answers written into the transport.

Measured, on the service in its own process (``python -m purgatory.adapters.service.serve``) and
real Kafka: a cold round first (the first after the service started: its reads fill the shared
record cache, bounded at 64 MiB, with the 4 MB range — memory that stays by design, reported
apart as ``record_cache_mb``), then the measured rounds; for each, RSS at its start, its peak
above that start while the connection is open (every poll's ``max_wait_ms`` is 1 s: all are due
well within the window), and above that start once the connection closed and the service
settled. Each round's client is closed by this process; the service is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass

import h2.config
import h2.connection
import h2.settings
from confluent_kafka import Producer
from purgatory.adapters.kafka import provide_cluster
from purgatory.adapters.kafka.local import free_port

from purgatory.settings import load_settings

from ..measure import rss_bytes
from .fanout import ServiceProcess

__all__ = ["ReplayResult", "RssCapExceeded", "main", "replay"]

POLLS = 100
MAX_BYTES = 4_000_000
RECORDS = 60
RECORD_BYTES = 100_000  # 60 records: ~6 MB on the partition, so every answer is a full 4 MB
OPEN_S = 8.0  # the connection stays open (unread) this long: every poll is due after 1 s
SETTLE_S = 4.0  # after the close: RSS sampled this long, the last sample reported
SAMPLE_S = 0.05
# The machine may be shared: past this above the service's RSS when it became ready, it is
# killed (by its PID) and the run reported as failed, rather than let it take the machine's memory.
RSS_CAP_MB = 1_500
MAX_WINDOW = 2**31 - 1


@dataclass
class ReplayResult:
    protocol: str
    rss_start_mb: float
    peak_above_start_mb: float
    after_close_above_start_mb: float
    cold: bool = False  # the first round: the shared record cache was still filling
    # After the close: the record cache's bytes (a bounded cache, by design: the first round's
    # reads fill it with the 4 MB range; docs/operations/limits.md), and RSS above start without them.
    record_cache_mb: float = 0.0
    after_close_without_record_cache_mb: float = 0.0


def _poll_target(topic: str) -> str:
    return f"/topics/{topic}/partitions/0/records?offset=0&max_bytes={MAX_BYTES}&max_wait_ms=1000"


def _h1_requests(topic: str) -> bytes:
    return (f"GET {_poll_target(topic)} HTTP/1.1\r\nHost: t\r\n\r\n").encode() * POLLS


def _h2_requests(topic: str) -> bytes:
    """The connection preface, SETTINGS with the largest window, the connection's window opened
    to 2^31-1 too, and POLLS streams of the long poll: everything the client ever sends."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: MAX_WINDOW}
    )
    conn.initiate_connection()
    conn.increment_flow_control_window(MAX_WINDOW - 65_535)
    for _ in range(POLLS):
        stream_id = conn.get_next_available_stream_id()
        headers = [
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "t"),
            (":path", _poll_target(topic)),
        ]
        conn.send_headers(stream_id, headers, end_stream=True)
    return conn.data_to_send()


class RssCapExceeded(RuntimeError):
    """The service grew past RSS_CAP_MB above its start and was killed."""


def _rss(service: ServiceProcess, cap: int) -> int:
    rss: int = rss_bytes(service.pid)
    if rss > cap:
        service.kill()
        raise RssCapExceeded(f"the service's RSS reached {rss / 1e6:.0f} MB: killed at the cap")
    return rss


def _round(service: ServiceProcess, port: int, request: bytes, cap: int) -> tuple[int, int, int]:
    """One unread connection: (RSS at start, peak while open, last sample after close), bytes."""
    start = _rss(service, cap)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peak = start
    try:
        client.connect(("127.0.0.1", port))
        client.sendall(request)
        # No event tells that the service wrote all it will to a client that never reads: RSS is
        # sampled for a bounded window, after every poll's max_wait_ms.
        deadline = time.monotonic() + OPEN_S
        while time.monotonic() < deadline:
            peak = max(peak, _rss(service, cap))
            time.sleep(SAMPLE_S)
    finally:
        client.close()
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        time.sleep(SAMPLE_S)
    return start, peak, _rss(service, cap)


def _record_cache_bytes(service: ServiceProcess) -> int:
    """The service's ``purgatory_service_record_cache_bytes`` (0 if it has none)."""
    with urllib.request.urlopen(f"{service.url}/metrics", timeout=30) as response:  # loopback only
        for line in response.read().decode().splitlines():
            if line.startswith("purgatory_service_record_cache_bytes "):
                return int(float(line.split()[1]))
    return 0


def _result(
    protocol: str, service: ServiceProcess, rss: tuple[int, int, int], cold: bool = False
) -> ReplayResult:
    start, peak, after = rss
    cached = _record_cache_bytes(service)
    return ReplayResult(
        protocol,
        start / 1e6,
        (peak - start) / 1e6,
        (after - start) / 1e6,
        cold=cold,
        record_cache_mb=cached / 1e6,
        after_close_without_record_cache_mb=(after - start - cached) / 1e6,
    )


def _fill_partition(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"unread-{uuid.uuid4().hex[:8]}"

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    for i in range(RECORDS):
        producer.produce(topic, bytes([i % 251]) * RECORD_BYTES, partition=0)
    if producer.flush(30):
        raise RuntimeError("the records were not all produced within 30 s")
    return topic


def replay(
    bootstrap: str, protocol: str, rounds: int = 1, env: dict[str, str] | None = None
) -> list[ReplayResult]:
    """One cold round (marked ``cold``), then ``rounds`` measured replays over ``protocol`` ("h1" or "h2")."""
    topic = _fill_partition(bootstrap)
    request = _h1_requests(topic) if protocol == "h1" else _h2_requests(topic)
    port = free_port()
    service = ServiceProcess(bootstrap, port, env=env)
    results = []
    try:
        service.wait_ready()
        cap = rss_bytes(service.pid) + RSS_CAP_MB * 1_000_000
        # The warm-up (the caches fill: module docstring) is reported too, marked cold.
        results.append(_result(protocol, service, _round(service, port, request, cap), cold=True))
        for _ in range(rounds):
            results.append(_result(protocol, service, _round(service, port, request, cap)))
    finally:
        service.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=("h1", "h2"), default="h2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with provide_cluster(load_settings().kafka) as cluster:
        results = replay(cluster.bootstrap_servers, args.protocol, args.rounds)
    for result in results:
        print(json.dumps(asdict(result)))
    cold = [r for r in results if r.cold]
    measured = [r for r in results if not r.cold]
    peaks = [r.peak_above_start_mb for r in measured]
    after = [r.after_close_above_start_mb for r in measured]
    runs = ", ".join(f"{p:.1f}" for p in peaks)
    runs_after = ", ".join(f"{a:.1f}" for a in after)
    print(
        f"{args.protocol}: peak above start median {statistics.median(peaks):.1f} MB (runs {runs}); "
        f"after close median {statistics.median(after):.1f} MB (runs {runs_after}); "
        f"cold round (first after start) peak {cold[0].peak_above_start_mb:.1f} MB, "
        f"after close {cold[0].after_close_above_start_mb:.1f} MB, of which the record cache "
        f"{cold[0].record_cache_mb:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
