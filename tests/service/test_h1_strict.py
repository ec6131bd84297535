"""HTTP/1.1 read strictly: framing, line ends, versions, numbers; a malformed request stays cheap.

Both paths of the service's own server are asked the same requests over raw sockets: the fast
long poll (``service.fast_long_poll``, the default) and the ASGI app alone. h11 parses for both,
so a request head refused here (``._h1_framing``) never reaches either path.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import structlog
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service.app._metadata import unreachable_offset
from purgatory.adapters.service.http.h1._framing import head_problem
from purgatory.adapters.service.settings import ServiceSettings
from structlog.testing import capture_logs

from purgatory.settings import Settings

from .conftest import WAIT_S, Served, exchange_until_closed, serving

pytestmark = pytest.mark.kafka

ANSWER_BOUND_S = 5.0  # a refusal is answered at once: well within this on a loaded machine


@pytest.fixture(scope="module", params=["fast", "asgi"])
def served(request: pytest.FixtureRequest, kafka_settings: KafkaSettings) -> Iterator[Served]:
    service = ServiceSettings(fast_long_poll=request.param == "fast")
    with serving(Settings(kafka=kafka_settings, service=service)) as served:
        yield served


def _exchange_until_closed(port: int, request: bytes, timeout_s: float = ANSWER_BOUND_S) -> bytes:
    return exchange_until_closed(port, request, timeout_s)


def _statuses(received: bytes) -> list[int]:
    return [int(line[9:12]) for line in received.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


def _body(received: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(received.partition(b"\r\n\r\n")[2])
    return body


# -- framing (item 3) ------------------------------------------------------------------------------

SMUGGLED = (
    b"POST /topics/t/records HTTP/1.1\r\nhost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\n"
    b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n"
)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(SMUGGLED, id="content-length-and-chunked"),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 0\r\n"
            b"\r\n0\r\n\r\n",
            id="chunked-and-content-length",
        ),
        pytest.param(b"GET /healthz HTTP/1.1\nhost: x\r\n\r\n", id="bare-lf-request-line"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nhost: x\n\r\n", id="bare-lf-header"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\n", id="bare-lf-blank-line"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n 2\r\n\r\n", id="obs-fold-space"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n\t2\r\n\r\n", id="obs-fold-tab"),
    ],
)
def test_an_ambiguous_request_head_is_400_and_the_connection_closed(
    served: Served, request_bytes: bytes
) -> None:
    received = _exchange_until_closed(served.port, request_bytes)
    assert _statuses(received) == [400], f"one 400, then closed (RFC 9112 §6.1): {received!r}"
    assert _body(received)["field"] == "headers"
    assert b"connection: close" in received.lower()


RECORD = b'{"records":[{"value":"a"}]}'


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(b"0\r\nx-t: 1\n\r\n", id="bare-lf-trailer-field"),
        pytest.param(b"0\r\n\n", id="bare-lf-blank-line"),
        pytest.param(b"0\r\nx-t: 1\r\n 2\r\n\r\n", id="obs-fold-trailer"),
        pytest.param(b"2\n{}\r\n0\r\n\r\n", id="bare-lf-chunk-size"),
    ],
)
def test_a_chunked_body_with_a_bare_lf_or_a_fold_in_its_trailers_is_400_and_closed(
    served: Served, kafka_topic_factory: Any, chunks: bytes
) -> None:
    # The head's rules hold for a chunked body's lines too: h11 would take these (a bare LF ends
    # a trailer section for it), a proxy in front may not — the bytes after would be another request.
    topic = kafka_topic_factory(1)
    head = (
        f"POST /topics/{topic}/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\n\r\n"
    ).encode()
    received = _exchange_until_closed(
        served.port, head + chunks + b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n"
    )
    assert _statuses(received) == [400], f"one 400, then closed: {received!r}"
    well_formed = _exchange_until_closed(
        served.port,
        head.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nconnection: close\r\n", 1)
        + b"%x\r\n%s\r\n0\r\nx-t: 1\r\n\r\n" % (len(RECORD), RECORD),
    )
    assert _statuses(well_formed) == [200], f"CRLF trailers are still read: {well_formed!r}"


def test_a_long_poll_with_a_bare_lf_is_400_on_either_path(served: Served, kafka_topic_factory: Any) -> None:
    topic = kafka_topic_factory(1)
    request = f"GET /topics/{topic}/partitions/0/records?offset=0&max_wait_ms=0 HTTP/1.1\r\nhost: x\n\r\n"
    assert _statuses(_exchange_until_closed(served.port, request.encode())) == [400]


@pytest.mark.parametrize("version", [b"1.2", b"1.9", b"2.0", b"0.9"])
def test_an_http_version_other_than_1_0_and_1_1_is_505_and_closed(served: Served, version: bytes) -> None:
    received = _exchange_until_closed(served.port, b"GET /healthz HTTP/%s\r\nhost: x\r\n\r\n" % version)
    assert _statuses(received) == [505], received
    assert "HTTP/" + version.decode() in _body(received)["message"]


def test_http_1_0_and_1_1_are_still_served(served: Served) -> None:
    for version in (b"1.0", b"1.1"):
        request = b"GET /healthz HTTP/%s\r\nhost: x\r\nconnection: close\r\n\r\n" % version
        assert _statuses(_exchange_until_closed(served.port, request)) == [200], version


@pytest.mark.parametrize(
    ("head", "refused"),
    [
        (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nx-content-length: 1\r\ntransfer-encoding: chunked\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nCONTENT-LENGTH: 1\r\nTransfer-Encoding: chunked\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nhost: a\rb\r\n\r\n", False),  # a bare CR: h11's own refusal
        (b"GET / HTTP/1.1\r\nhost: x\r\n\t\r\n\r\n", True),
    ],
)
def test_head_problem_reads_the_raw_head(head: bytes, refused: bool) -> None:
    assert (head_problem(head) is not None) is refused, head


# -- numbers (item 5) ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["%2B1", "%201", "1%20", "1_0", "1.0", "-0", "%EF%BC%91", "0x1", ""])
@pytest.mark.parametrize("name", ["offset", "max_wait_ms", "min_bytes", "max_bytes", "min_records"])
def test_a_query_number_not_in_ascii_digits_is_400_naming_it(
    served: Served, kafka_topic_factory: Any, name: str, value: str
) -> None:
    topic = kafka_topic_factory(1)
    target = f"/topics/{topic}/partitions/0/records?{name}={value}"
    received = _exchange_until_closed(
        served.port, f"GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
    )
    assert _statuses(received) == [400], received
    assert _body(received)["field"] == name, received


@pytest.mark.parametrize("partition", ["00", "01", "%2B0", "0.0", "0_0"])
def test_a_partition_with_a_leading_zero_or_sign_is_400(
    served: Served, kafka_topic_factory: Any, partition: str
) -> None:
    topic = kafka_topic_factory(1)
    target = f"/topics/{topic}/partitions/{partition}/records?offset=0&max_wait_ms=0"
    received = _exchange_until_closed(
        served.port, f"GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
    )
    assert _statuses(received) == [400], received
    assert _body(received)["field"] == "partition"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offsets=00:1", "offsets"),
        ("offsets=0:%2B1", "offsets"),
        ("offsets=0:1_0", "offsets"),
        ("offsets=0:1&epochs=00:1", "epochs"),
        ("offsets=0:1&timeout_ms=%2B5", "timeout_ms"),
        ("offsets=0:1&timeout_ms=5.0", "timeout_ms"),
    ],
)
def test_replicated_numbers_are_ascii_digits(
    served: Served, kafka_topic_factory: Any, query: str, field: str
) -> None:
    topic = kafka_topic_factory(1)
    request = f"GET /topics/{topic}/replicated?{query} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    received = _exchange_until_closed(served.port, request.encode())
    assert _statuses(received) == [400], received
    assert _body(received)["field"] == field


# -- /replicated past the log end (item 4) ---------------------------------------------------------


@pytest.mark.parametrize("offset", [2**63 - 1, 2**40])
def test_replicated_past_the_log_end_is_416_at_once(
    served: Served, kafka_topic_factory: Any, offset: int
) -> None:
    topic = kafka_topic_factory(1)
    target = f"/topics/{topic}/replicated?offsets=0:{offset}&timeout_ms=60000"
    request = f"GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    started = time.monotonic()
    received = _exchange_until_closed(served.port, request.encode(), timeout_s=WAIT_S)
    assert _statuses(received) == [416], received
    assert time.monotonic() - started < ANSWER_BOUND_S, "answered at once, not after the wait"
    body = _body(received)
    assert body["error"] == "OFFSET_OUT_OF_RANGE" and body["field"] == "offsets", body


def test_an_offset_an_append_may_still_reach_is_waited_for() -> None:
    # Appended with acks=1 and not yet replicated: past the high watermark, still a legal wait.
    assert not unreachable_offset(1_000, 0, 30_000)
    assert not unreachable_offset(5, 0, 0)
    assert unreachable_offset(2**63 - 1, 10**12, 300_000)


# -- a malformed body is a cheap refusal (item 8) --------------------------------------------------

BAD_CHUNK = (
    b"POST /topics/t/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"transfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
)


@contextmanager
def _stdlib_warnings(*names: str) -> Iterator[list[logging.LogRecord]]:
    """Records at WARNING or above of the named stdlib loggers (uvicorn's do not reach the root)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(logging.WARNING)
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def test_a_bad_chunk_size_is_400_not_an_unexpected_error(served: Served, kafka_topic_factory: Any) -> None:
    topic = kafka_topic_factory(1)
    request = BAD_CHUNK.replace(b"/topics/t/", f"/topics/{topic}/".encode())
    errors = served.app.state.unexpected_errors
    before = errors.count
    with capture_logs() as events, _stdlib_warnings("uvicorn.error", "asyncio") as records:
        for _ in range(5):
            assert _statuses(_exchange_until_closed(served.port, request)) == [400]
        # The handler of each learns of the disconnect after the 400 went out: ask once more so
        # the last one has finished (a request on a connection of its own, answered after).
        _exchange_until_closed(served.port, b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert errors.count == before, "a client's malformed body is not an unexpected error"
    assert not [e for e in events if e.get("exc_info") or e["log_level"] in ("error", "critical")], events
    assert len(records) <= 5, "at most one short line per request"
    assert all("\n" not in r.getMessage() and not r.exc_info for r in records), records


def test_json_logs_hold_no_local_variables(capsys: pytest.CaptureFixture[str]) -> None:
    from purgatory import configure_logging

    try:
        configure_logging("INFO", "json", force=True)
        secret_local = "local-value-never-logged"  # noqa: F841  (what rich's show_locals would print)
        try:
            raise ValueError("boom")
        except ValueError:
            structlog.get_logger("t").exception("failed")
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        structlog.reset_defaults()
    event = json.loads(line)
    assert "ValueError: boom" in event["exception"]
    assert "local-value-never-logged" not in line


REPLAY_RATE = 100  # malformed requests per second, the attack report's rate
REPLAY_S = 3.0  # long enough for ~300 requests and ~150 health probes, bounded
PROBE_INTERVAL_S = 0.02  # ~50 probes/s
HEALTHZ_P99_BOUND_S = 0.020


# The replaying client, in a process of its own: in the test's process its thread would compete
# with the server's loop for the GIL, and that contention, not the server, would be measured.
_REPLAY = """
import socket, sys, time
port, rate, seconds, request = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].encode()
request = request.decode('unicode_escape').encode('latin-1')
started, sent = time.monotonic(), 0
while time.monotonic() - started < seconds:
    with socket.create_connection(('127.0.0.1', port), timeout=5) as sock:
        sock.sendall(request)
        while sock.recv(65536):
            pass
    sent += 1
    time.sleep(max(0.0, started + sent / rate - time.monotonic()))  # pacing at the rate
print(sent)
"""


def test_bad_chunks_at_100_per_s_keep_healthz_p99_under_20_ms(
    served: Served, kafka_topic_factory: Any
) -> None:
    """The item 8 replay, bounded: what it attacks is the loop's time per malformed request (a rich
    traceback with locals was 0.57 s of CPU each), seen as /healthz latency on a connection of its own."""
    topic = kafka_topic_factory(1)
    request = BAD_CHUNK.replace(b"/topics/t/", f"/topics/{topic}/".encode())
    errors = served.app.state.unexpected_errors.count
    escaped = request.decode("latin-1").encode("unicode_escape").decode("ascii")
    attacker = subprocess.Popen(
        [sys.executable, "-c", _REPLAY, str(served.port), str(REPLAY_RATE), str(REPLAY_S), escaped],
        stdout=subprocess.PIPE,
        text=True,
    )
    latencies: list[float] = []
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=ANSWER_BOUND_S) as sock:
            while attacker.poll() is None:
                began = time.perf_counter()
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                answer = b""
                while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                    answer += sock.recv(65536)
                latencies.append(time.perf_counter() - began)
                time.sleep(PROBE_INTERVAL_S)  # a health checker's pace, not a load of its own
        sent = int(attacker.communicate(timeout=ANSWER_BOUND_S)[0])
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    assert sent >= REPLAY_RATE * REPLAY_S * 0.8, f"the replay kept its rate: {sent} sent"
    latencies.sort()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99) - 1]
    print(
        f"bad chunks {sent}, /healthz probes {len(latencies)}: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
    )
    assert p99 < HEALTHZ_P99_BOUND_S, f"/healthz p99 {p99 * 1000:.1f} ms under the replay"
    assert served.app.state.unexpected_errors.count == errors
