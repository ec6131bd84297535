"""Every documented way to run the service gets the fast paths (issue 30), or says it does not.

* ``purgatory serve`` and ``uvicorn --factory ...:create_app --http ...:LongPollHttp`` (each a
  child process on a socket this test bound, stopped by its PID) answer a long poll on the fast
  path — HTTP/1.1 and h2c — seen in ``purgatory_service_task_free_long_polls_total`` (counted
  only by the protocols' fast paths), and log no slow-path warning;
* ``create_app`` under plain uvicorn answers through the app (the counter stays) and logs the
  slow-path warning once, at start, not per request;
* a long poll sent with ``Connection: close`` or as HTTP/1.0 is taken by the fast path, answered
  with ``Connection: close``, and its connection closed; a request pipelined after it is not served.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import structlog
import structlog.testing
import uvicorn
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import LongPollHttp, create_app
from purgatory.adapters.service.app._fast_paths import ServerFastPaths
from purgatory.adapters.service.http._endpoint import ENDPOINT_STATE_KEY
from purgatory.adapters.service.http.h1._long_poll import LongPollH11Protocol
from purgatory.adapters.service.server._long_poll_http import protocol_for_state
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from purgatory.settings import Settings

from .conftest import WAIT_S, Served, exchange_until_closed, serving

pytestmark = pytest.mark.kafka

FAST_METRIC = "purgatory_service_task_free_long_polls_total"
SLOW_PATH_EVENT = b"long_polls_on_slow_path"
STOP_TIMEOUT_S = 20.0
BIN = Path(sys.executable).parent


# -- child processes -------------------------------------------------------------------------------


class Child:
    """A server command in a child process, on a socket bound here (``--fd``: no port race)."""

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.stderr = b""

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:  # not accepting yet (the socket queues), or 503 while starting
                pass
            time.sleep(0.05)  # the child has no readiness event to await: bounded polling
        raise AssertionError(f"the server did not come up within {timeout_s:.0f} s")

    def fast_answers(self) -> int:
        for line in httpx.get(f"{self.url}/metrics", timeout=WAIT_S).text.splitlines():
            if line.startswith(FAST_METRIC + " "):
                return int(float(line.split()[1]))
        raise AssertionError(f"{FAST_METRIC} not in /metrics")


@contextmanager
def child(command: list[str], kafka_settings: KafkaSettings) -> Iterator[Child]:
    """``command`` (``{fd}`` replaced by a bound socket's descriptor), stopped by its PID after."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    fd = sock.fileno()
    env = {
        **os.environ,
        "PURGATORY_KAFKA__BOOTSTRAP_SERVERS": str(kafka_settings.bootstrap_servers),
        "PURGATORY_LOG__FORMAT": "json",
        "PURGATORY_LOG__LEVEL": "INFO",
    }
    process = subprocess.Popen(
        [part.replace("{fd}", str(fd)) for part in command],
        env=env,
        pass_fds=(fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    running = Child(process, sock.getsockname()[1])
    sock.close()  # the child has its own descriptor of it
    try:
        running.wait_ready()
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # graceful: the lifespan drains, then it exits
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        assert process.stderr is not None
        running.stderr = process.stderr.read()
        process.stderr.close()


PURGATORY_SERVE = [str(BIN / "purgatory"), "serve", "--fd", "{fd}"]
UVICORN = [
    str(BIN / "uvicorn"),
    "--factory",
    "purgatory.adapters.service:create_app",
    "--fd",
    "{fd}",
    "--log-level",
    "info",
]
UVICORN_FAST = [*UVICORN, "--http", "purgatory.adapters.service:LongPollHttp"]


def _long_poll_on(server: Child, topic: str, *, http2: bool = False) -> None:
    """A long poll for a record already there: answered at once, 200 with it."""
    with httpx.Client(base_url=server.url, timeout=WAIT_S, http1=not http2, http2=http2) as client:
        path = f"/topics/{topic}/partitions/0/records"
        answer = client.get(path, params={"offset": 0, "max_wait_ms": 5000})
        assert answer.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    assert answer.status_code == 200 and answer.json()["records"][0]["value"] == "r", answer.text


def _produce_and_cache(server: Child, topic: str) -> None:
    """One record, and the partition's metadata cached (the fast path takes only what is cached)."""
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        produced = client.post(f"/topics/{topic}/records", json={"records": [{"value": "r"}]})
        assert produced.status_code == 200, produced.text
        client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0, "max_wait_ms": 0})


@pytest.mark.parametrize(
    "command", [PURGATORY_SERVE, UVICORN_FAST], ids=["purgatory-serve", "uvicorn-http-class"]
)
def test_each_fast_way_to_run_answers_long_polls_on_the_fast_path_over_http11_and_h2c(
    kafka_settings: KafkaSettings, kafka_topic_factory: Any, command: list[str]
) -> None:
    topic = kafka_topic_factory(1)
    with child(command, kafka_settings) as server:
        _produce_and_cache(server, topic)
        before = server.fast_answers()
        _long_poll_on(server, topic)
        assert server.fast_answers() == before + 1, "the HTTP/1.1 long poll was served below the app"
        _long_poll_on(server, topic, http2=True)
        assert server.fast_answers() == before + 2, "the h2c long poll was served below the app"
    assert SLOW_PATH_EVENT not in server.stderr, server.stderr[-2000:]


def test_create_app_under_plain_uvicorn_warns_once_at_start_and_serves_through_the_app(
    kafka_settings: KafkaSettings, kafka_topic_factory: Any
) -> None:
    topic = kafka_topic_factory(1)
    with child(UVICORN, kafka_settings) as server:
        _produce_and_cache(server, topic)
        before = server.fast_answers()
        for _ in range(3):
            _long_poll_on(server, topic)
        assert server.fast_answers() == before, "plain uvicorn has no fast path"
    assert server.stderr.count(SLOW_PATH_EVENT) == 1, server.stderr[-2000:]
    warning = next(line for line in server.stderr.splitlines() if SLOW_PATH_EVENT in line)
    assert b"LongPollHttp" in warning and b"purgatory serve" in warning, warning


# -- Connection: close and HTTP/1.0 ----------------------------------------------------------------


@pytest.fixture(scope="module")
def served(kafka_settings: KafkaSettings) -> Iterator[Served]:
    with serving(Settings(kafka=kafka_settings)) as served:
        yield served


def _exchange_until_closed(port: int, request: bytes, timeout_s: float = WAIT_S) -> bytes:
    return exchange_until_closed(port, request, timeout_s)


def _cached_topic(served: Served, kafka_topic_factory: Any) -> str:
    topic = kafka_topic_factory(1)
    with httpx.Client(base_url=served.url, timeout=WAIT_S) as client:
        produced = client.post(f"/topics/{topic}/records", json={"records": [{"value": "r"}]})
        assert produced.status_code == 200, produced.text
        client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0, "max_wait_ms": 0})
    return topic


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        b"HTTP/1.1\r\nhost: x\r\nConnection: Keep-Alive, Close\r\n\r\n",
        b"HTTP/1.0\r\n\r\n",
        b"HTTP/1.0\r\nconnection: keep-alive\r\n\r\n",  # h11 keeps no HTTP/1.0 connection alive
    ],
    ids=["close", "close-among-tokens", "http10", "http10-keep-alive"],
)
def test_a_long_poll_that_closes_is_served_by_the_fast_path_then_closed_and_what_follows_is_not_served(
    served: Served, kafka_topic_factory: Any, head: bytes
) -> None:
    topic = _cached_topic(served, kafka_topic_factory)
    before = served.taken
    poll = b"GET /topics/%s/partitions/0/records?offset=0&max_wait_ms=5000 " % topic.encode() + head
    pipelined = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    received = _exchange_until_closed(served.port, poll + pipelined)
    assert served.taken == before + 1, "taken by the fast path"
    assert received.count(b"HTTP/1.1 ") == 1, f"one answer, the pipelined request not served: {received!r}"
    head_bytes, _, body = received.partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 200 OK\r\n"), received
    assert head_bytes.endswith(b"\r\nConnection: close"), "h11's close header, last as h11 writes it"
    assert b'"value":"r"' in body.replace(b" ", b""), body


def test_a_closing_long_poll_answer_is_the_asgi_paths_bytes(
    kafka_settings: KafkaSettings, kafka_topic_factory: Any
) -> None:
    """The same request through the fast path and through the app: the same bytes (but the date,
    the topic's name and the record's timestamp, each server's own)."""
    answers = []
    for fast in (True, False):
        settings = Settings.model_validate(
            {"kafka": kafka_settings.model_dump(), "service": {"fast_long_poll": fast}}
        )
        with serving(settings) as served:
            topic = _cached_topic(served, kafka_topic_factory)
            poll = (
                b"GET /topics/%s/partitions/0/records?offset=0&max_wait_ms=5000 HTTP/1.0\r\n\r\n"
                % topic.encode()
            )
            before = served.taken
            received = _exchange_until_closed(served.port, poll)
            assert served.taken == before + int(fast)
        lines = [line for line in received.split(b"\r\n") if not line.startswith(b"date: ")]
        # The topic's name and its record's timestamp are each server's own.
        answers.append(
            [re.sub(rb'"timestamp_ms":\d+', b"", line.replace(topic.encode(), b"T")) for line in lines]
        )
    assert answers[0] == answers[1], answers


# -- LongPollHttp without a server -----------------------------------------------------------------


def test_long_poll_http_makes_each_servers_protocol_from_its_lifespan_state_once() -> None:
    settings = Settings.model_validate({"kafka": {"bootstrap_servers": "127.0.0.1:1"}})  # never connected
    apps = [create_app(settings), create_app(settings)]
    states: list[dict[str, Any]] = [{ENDPOINT_STATE_KEY: app.state.endpoint} for app in apps]
    classes = [protocol_for_state(state) for state in states]
    assert classes[0] is not classes[1], "one class per server (its app's endpoint)"
    for cls, state, app in zip(classes, states, apps, strict=True):
        assert protocol_for_state(state) is cls, "made once per server, not per connection"
        assert issubclass(cls, LongPollH11Protocol) and cls.endpoint is app.state.endpoint
    assert not getattr(protocol_for_state({}), "endpoint", None), "no endpoint: no fast path"

    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(apps[0], http=LongPollHttp)
        config.load()
        connection = LongPollHttp(config=config, server_state=ServerState(), app_state=states[0], _loop=loop)
        assert type(connection) is classes[0], "uvicorn's call returns the server's real protocol"
    finally:
        loop.close()


async def test_the_app_puts_its_endpoint_into_the_lifespan_state_and_warns_only_without_fast_paths() -> None:
    settings = Settings.model_validate({"kafka": {"bootstrap_servers": "127.0.0.1:1"}})  # never connected
    endpoint = create_app(settings).state.endpoint

    class Lifespan:  # as uvicorn's LifespanOn: receive is its method, its config names the class
        def __init__(self, protocol: Any) -> None:
            self.config = SimpleNamespace(http_protocol_class=protocol)

        async def receive(self) -> dict[str, Any]:
            return {"type": "lifespan.startup"}

    async def started(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "lifespan.startup.complete"})

    async def sent(message: Any) -> None:
        return None

    for protocol, slow in ((LongPollHttp, False), (H11Protocol, True), (None, True)):
        state: dict[str, Any] = {}
        with structlog.testing.capture_logs() as captured:
            await ServerFastPaths(started, endpoint)(
                {"type": "lifespan", "state": state}, Lifespan(protocol).receive, sent
            )
        assert state[ENDPOINT_STATE_KEY] is endpoint
        events = [entry["event"] for entry in captured]
        assert events == (["long_polls_on_slow_path"] if slow else []), (protocol, events)
