"""Limits of the HTTP layer: header count and size, the body-read timeout, and the JSON catch-all.

Each test starts its own service (uvicorn on 127.0.0.1, real Kafka) with the ``service.*``
settings it needs, and checks both the refusal and that the server keeps serving.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.app._guards import CatchAll, UnexpectedErrors
from purgatory.adapters.service.server._server import BackgroundServer
from purgatory.adapters.service.settings import ServiceSettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from purgatory.settings import Settings
from tests.kafka.kafka_fixtures import TopicFactory

ATTACK_HEADERS = 10_000  # the figure
BODY_READ_TIMEOUT_MS = 500
ANSWER_BOUND_S = 10.0  # the 408 must come within the timeout, plus this much for a loaded machine


def _served(kafka: KafkaSettings, **service: object) -> BackgroundServer:
    settings = Settings(kafka=kafka, service=ServiceSettings.model_validate(service))
    return BackgroundServer(create_app(settings))


@pytest.fixture(scope="module")
def default_limits(kafka_settings: KafkaSettings) -> Iterator[str]:
    with _served(kafka_settings) as server:
        yield server.url


@pytest.fixture(scope="module")
def large_head_allowed(kafka_settings: KafkaSettings) -> Iterator[str]:
    """h11 lets a 1 MiB head through: the app's own count limit must refuse 10,000 headers."""
    with _served(kafka_settings, max_header_bytes=1024 * 1024) as server:
        yield server.url


def _head(count: int, path: str = "/healthz", header: bytes = b"") -> bytes:
    """A GET whose head carries ``count`` small header fields (and ``header``, raw)."""
    fields = b"".join(b"x-h%d: v\r\n" % i for i in range(count))
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n".encode() + fields + header + b"\r\n"


class _Connection:
    """One raw HTTP/1.1 connection: httpx takes seconds to *build* 10,000 headers; a socket does not."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30.0)
        self.reader = self.sock.makefile("rb")

    def exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send ``request``; the answer's status, headers and body (read by its Content-Length)."""
        self.sock.sendall(request)
        status = self.reader.readline()
        assert status, "the server closed the connection"
        headers = {}
        while (line := self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = self.reader.read(int(headers.get("content-length", "0")))
        return int(status.split()[1]), headers, body

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reader.close()
        self.sock.close()


def test_ten_thousand_headers_are_refused_by_the_app_with_a_json_431(large_head_allowed: str) -> None:
    with _Connection(large_head_allowed) as connection:
        status, headers, body = connection.exchange(_head(ATTACK_HEADERS))
        assert status == 431, body
        assert headers["content-type"] == "application/json"
        error = json.loads(body)
        assert error["field"] == "headers" and error["error"] == "REQUEST_HEADER_FIELDS_TOO_LARGE"
        assert error["message"].startswith(f"{ATTACK_HEADERS + 1} header fields"), error
        status, _, _ = connection.exchange(_head(0))
        assert status == 200, "the next request on the same connection is served"


def test_ten_thousand_headers_are_refused_with_the_default_settings(default_limits: str) -> None:
    # ~100 KB of head: h11 refuses it (plain 400, connection closed) only when it arrives in
    # pieces, since its limit bounds the *incomplete* buffer; arriving whole, it reaches the
    # app, whose HeaderLimits refuses it (431). Either way it is never served.
    with _Connection(default_limits) as connection:
        status, _, body = connection.exchange(_head(ATTACK_HEADERS))
        assert status in (400, 431), body
    with _Connection(default_limits) as connection:
        assert connection.exchange(_head(0))[0] == 200, "the server keeps serving"


def test_more_header_fields_than_allowed_get_a_json_431_naming_them(default_limits: str) -> None:
    count = ServiceSettings().max_header_count  # plus Host: one too many
    with _Connection(default_limits) as connection:
        status, _, body = connection.exchange(_head(count))
        assert status == 431
        assert json.loads(body)["field"] == "headers"
        assert connection.exchange(_head(count - 1))[0] == 200, "exactly the limit is served"


def test_header_bytes_over_the_limit_get_a_json_431(kafka_settings: KafkaSettings) -> None:
    # One field larger than the app's byte limit, in a head h11 accepts: the app refuses it.
    with _served(kafka_settings, max_header_bytes=4096) as server, _Connection(server.url) as connection:
        status, _, body = connection.exchange(_head(0, header=b"x-big: " + b"b" * 3000 + b"\r\n"))
        assert status == 200, body
        status, _, body = connection.exchange(_head(0, header=b"x-big: " + b"b" * 4100 + b"\r\n"))
        assert status in (400, 431), body  # h11 (head > 4096 while incomplete) or the app
        if status == 431:
            assert json.loads(body)["field"] == "headers"
            assert connection.exchange(_head(0))[0] == 200


def _raw_request(url: str, request: bytes, timeout_s: float) -> tuple[bytes, float]:
    """Send ``request`` on a fresh connection; everything the server answers until it closes."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, time.monotonic() - started


def test_a_body_shorter_than_its_content_length_gets_408_within_the_read_timeout(
    kafka_settings: KafkaSettings,
) -> None:
    with _served(kafka_settings, body_read_timeout_ms=BODY_READ_TIMEOUT_MS) as server:
        body = b'{"records": [{"value": "a"}]}'
        request = (
            b"POST /topics/any-topic/records HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body) + 100}\r\n\r\n".encode()
            + body
        )
        answer, elapsed = _raw_request(
            server.url, request, timeout_s=BODY_READ_TIMEOUT_MS / 1000 + ANSWER_BOUND_S
        )
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"connection: close" in head.lower(), "the rest of the body may still come: close"
        error = json.loads(payload)
        assert error["error"] == "REQUEST_TIMEOUT" and error["field"] == "body", error
        assert elapsed >= BODY_READ_TIMEOUT_MS / 1000, "answered before the timeout ran out"
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/healthz").status_code == 200, "the server keeps serving"


HEAD_READ_TIMEOUT_MS = 500
TRICKLE_EVERY_S = 0.1  # one header line per interval: each arrival reset uvicorn's only timer


def _trickle_head(sock: socket.socket, deadline: float) -> tuple[bytes, int]:
    """Send a GET head one header line at a time, never its end; what the server answers until it
    closes, and how many lines were sent. The pacing is the attack itself, not a wait."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
    answer, lines = b"", 0
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], TRICKLE_EVERY_S)
        if readable:
            chunk = sock.recv(65536)
            if not chunk:
                return answer, lines
            answer += chunk
            continue
        try:
            sock.sendall(b"x-slow-%d: v\r\n" % lines)
        except (BrokenPipeError, ConnectionResetError):
            break  # closed while we sent: read what it answered
        lines += 1
    sock.settimeout(1.0)
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return answer, lines


@pytest.mark.parametrize("connection", ["fresh", "kept alive after a first request"])
def test_a_request_head_trickled_slowly_gets_408_within_the_head_timeout(
    kafka_settings: KafkaSettings, connection: str
) -> None:
    """Slowloris: header lines trickled in for ever. uvicorn's keep-alive timer is reset by every
    byte and a fresh connection has none: the head was never bounded in time."""
    with _served(kafka_settings, head_read_timeout_ms=HEAD_READ_TIMEOUT_MS) as server:
        # Before the connection: the server arms the timer when the connection is made (or the
        # first answer is complete), which can precede anything the client does after connecting.
        started = time.monotonic()
        with _Connection(server.url) as conn:
            if connection != "fresh":
                status, _, _ = conn.exchange(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
                assert status == 200
            answer, lines = _trickle_head(conn.sock, started + HEAD_READ_TIMEOUT_MS / 1000 + ANSWER_BOUND_S)
            elapsed = time.monotonic() - started
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), (answer[:300], lines, elapsed)
        assert b"connection: close" in head.lower()
        error = json.loads(payload)
        assert error["error"] == "REQUEST_TIMEOUT" and error["field"] == "headers", error
        assert HEAD_READ_TIMEOUT_MS / 1000 <= elapsed < HEAD_READ_TIMEOUT_MS / 1000 + ANSWER_BOUND_S
        assert lines >= 2, "the head kept arriving while the timeout ran"
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/healthz").status_code == 200, "the server keeps serving"


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(
    kafka_settings: KafkaSettings,
) -> None:
    with _served(kafka_settings, head_read_timeout_ms=HEAD_READ_TIMEOUT_MS) as server:
        host, port = server.url.removeprefix("http://").split(":")
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=ANSWER_BOUND_S) as sock:
            assert sock.recv(65536) == b"", "closed without an answer (no request to answer)"
        assert HEAD_READ_TIMEOUT_MS / 1000 <= time.monotonic() - started < ANSWER_BOUND_S


def test_a_head_received_in_time_is_served_however_long_the_answer_takes(
    kafka_settings: KafkaSettings, kafka_topic_factory: TopicFactory
) -> None:
    """The head timer stops once the head is in: long polls longer than it are answered (the
    second on the kept-alive connection, whose next head is timed again)."""
    topic = kafka_topic_factory(1)
    wait_ms = 2 * HEAD_READ_TIMEOUT_MS
    with (
        _served(kafka_settings, head_read_timeout_ms=HEAD_READ_TIMEOUT_MS) as server,
        httpx.Client(base_url=server.url, timeout=ANSWER_BOUND_S) as client,
    ):
        for _ in range(2):
            started = time.monotonic()
            response = client.get(f"/topics/{topic}/partitions/0/records", params={"max_wait_ms": wait_ms})
            assert response.status_code == 200, response.text
            assert response.json()["outcome"] == "EXPIRED"
            assert time.monotonic() - started >= wait_ms / 1000


# -- the catch-all: what no route expected is a JSON 500, and the connection stays usable -------


async def _boom(request: Request) -> Response:
    raise RuntimeError("a bug")


async def _fine(request: Request) -> Response:
    return JSONResponse({"ok": True})


def test_an_unexpected_exception_is_a_json_500_on_a_connection_that_stays_usable() -> None:
    errors = UnexpectedErrors()
    app = Starlette(
        routes=[Route("/boom", _boom), Route("/fine", _fine)],
        middleware=[Middleware(CatchAll, errors=errors)],
    )
    with BackgroundServer(app, log_level="critical") as server, _Connection(server.url) as connection:
        status, _, body = connection.exchange(b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status == 500
        assert json.loads(body)["error"] == "UNKNOWN_SERVER_ERROR"
        assert b"a bug" not in body, "internals are logged, not told to the client"
        status, _, body = connection.exchange(b"GET /fine HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (status, json.loads(body)) == (200, {"ok": True}), "uvicorn did not close the connection"
    assert errors.count == 1


AFTER_408_LINES = 20  # lines sent after the 408 and its FIN, 10 ms apart (well within LINGER_S)


def test_a_client_still_sending_after_its_408_gets_no_reset(kafka_settings: KafkaSettings) -> None:
    """Lingering close (RFC 9112 §9.6): a trickling client always has a line in flight when its
    head times out. Closing with that input unread sends a reset, which can erase the client's
    unread 408 (the flake of the trickle test: ConnectionResetError on the read after the 408).
    The server half-closes after the 408 and reads what still comes: no reset while it lingers."""
    with _served(kafka_settings, head_read_timeout_ms=HEAD_READ_TIMEOUT_MS) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=ANSWER_BOUND_S) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
            answer = b""
            while chunk := sock.recv(65536):  # the 408, then the server's FIN
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
            sent = 0
            for sent in range(1, AFTER_408_LINES + 1):
                try:
                    sock.sendall(b"x-late-%d: v\r\n" % sent)
                except (BrokenPipeError, ConnectionResetError) as exc:
                    raise AssertionError(
                        f"reset after {sent} late lines: the server closed unread input"
                    ) from exc
                time.sleep(0.01)  # the attack's pacing, not a wait for the server
            assert sent == AFTER_408_LINES
