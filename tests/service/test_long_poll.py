"""The protocol-level long poll (``service.fast_long_poll``): same answers as the ASGI route, no task.

Two services on the same Kafka, one with the fast path (the default) and one without, answer the
same requests; raw HTTP/1.1 over a socket compares their bytes (the ``date`` header aside). The
first request on a topic goes through the ASGI route either way (metadata not cached yet), so
each test warms its topic up first and checks that the request it compares was the fast path's.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service.http.h1._head_timeout import HeadTimeoutH11Protocol
from purgatory.adapters.service.http.h1._long_poll import LongPollH11Protocol
from purgatory.adapters.service.server._server import uvicorn_options
from purgatory.adapters.service.settings import ServiceSettings

from purgatory.settings import Settings

from .conftest import WAIT_S, Served, serving, until
from .test_auth import Pki, pki  # noqa: F401  (the mutual TLS material, made per module)

TOKEN = "token-fast-path-1d9e"
_DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")


@contextmanager
def _served(kafka: KafkaSettings, **service: object) -> Iterator[Served]:
    with serving(Settings(kafka=kafka, service=ServiceSettings.model_validate(service))) as served:
        yield served


@pytest.fixture(scope="module")
def fast(kafka_settings: KafkaSettings) -> Iterator[Served]:
    with _served(kafka_settings) as served:
        yield served


@pytest.fixture(scope="module")
def slow(kafka_settings: KafkaSettings) -> Iterator[Served]:
    with _served(kafka_settings, fast_long_poll=False) as served:
        yield served


class RawConnection:
    """One HTTP/1.1 connection, written and read as bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def send(self, request: bytes) -> None:
        self.writer.write(request)

    async def response(self, timeout_s: float = WAIT_S) -> bytes:
        """One whole response (head and Content-Length body), the date header blanked."""
        async with asyncio.timeout(timeout_s):
            head = await self.reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"\r\ncontent-length: (\d+)\r\n", head).group(1))  # type: ignore[union-attr]
            body = await self.reader.readexactly(length)
        return _DATE.sub(b"\r\ndate: -\r\n", head) + body

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _get(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def _ask(port: int, request: bytes) -> bytes:
    conn = await RawConnection.open(port)
    try:
        conn.send(request)
        return await conn.response()
    finally:
        await conn.close()


def _produce(port: int, topic: str, *values: str) -> int:
    """Produce ``values`` through the service; the offset of the first."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as client:
        answer = client.post(f"/topics/{topic}/records", json={"records": [{"value": v} for v in values]})
        assert answer.status_code == 200, answer.text
        offset: int = answer.json()["records"][0]["offset"]
        return offset


def _warm(port: int, topic: str, *headers: str) -> None:
    """Metadata cached and the partition followed: the next long poll can take the fast path."""
    asyncio.run(_ask(port, _get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=0", *headers)))


# -- same answers ---------------------------------------------------------------------------------


def test_answers_from_the_fast_path_are_the_asgi_paths_bytes(
    fast: Served, slow: Served, kafka_topic_factory: object
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    _produce(fast.port, topic, "a", "b")
    for served in (fast, slow):
        _warm(served.port, topic)
    requests = [
        _get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=5000"),  # records there
        _get(f"/topics/{topic}/partitions/0/records?offset=2&max_wait_ms=50"),  # expires, empty
        _get(f"/topics/{topic}/partitions/0/records?offset=99&max_wait_ms=5000"),  # 416 at the answer
        _get(
            f"/topics/{topic}/partitions/0/records?offset=1&max_wait_ms=5000&min_bytes=9&max_bytes=8"
        ),  # 400
        _get(f"/topics/{topic}/partitions/7/records?offset=0"),  # 404: no such partition
        _get("/topics/_internal/partitions/0/records?offset=0"),  # 403: the topic policy
        _get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=1&bogus=1"),  # 400: unknown name
    ]
    before = fast.taken
    for request in requests:
        expected = asyncio.run(_ask(slow.port, request))
        assert asyncio.run(_ask(fast.port, request)) == expected, request
    # The first two waited (or were answered) on the fast path; the refusals went through ASGI,
    # and so did the offset past the facts' end (Kafka is asked whether it is in range).
    assert fast.taken - before == 2
    assert slow.long_poll is None


def test_a_waiting_long_poll_is_answered_with_the_asgi_paths_bytes(
    fast: Served, slow: Served, kafka_topic_factory: object
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    for served in (fast, slow):
        _warm(served.port, topic)

    async def wait_both() -> tuple[bytes, bytes]:
        conns = [await RawConnection.open(s.port) for s in (fast, slow)]
        for conn in conns:
            conn.send(_get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=30000"))
        await until(lambda: fast.pending >= 1 and slow.pending >= 1, "both long polls waiting")
        await asyncio.to_thread(_produce, fast.port, topic, "fan-out")
        answers = (await conns[0].response(), await conns[1].response())
        for conn in conns:
            await conn.close()
        return answers

    before = fast.taken
    from_fast, from_slow = asyncio.run(wait_both())
    assert fast.taken == before + 1
    assert b'"outcome":"COMPLETED"' in from_fast
    assert from_fast == from_slow


def test_a_zero_wait_long_poll_right_after_a_produce_answers_the_acknowledged_record(
    fast: Served, slow: Served, kafka_topic_factory: object
) -> None:
    # Kafka's fetch with max_wait_ms=0 reads the log: a record whose acks=all produce was answered
    # is below the high watermark, so it is in the answer. The change feed may not have seen the
    # append yet (it learns of it a few ms later): the answer must not rest on its facts alone.
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    for served in (fast, slow):
        _warm(served.port, topic)
    before = fast.taken
    for served in (fast, slow):
        for i in range(10):
            value = f"read-your-write-{served.port}-{i}"
            offset = _produce(served.port, topic, value)
            path = f"/topics/{topic}/partitions/0/records?offset={offset}&max_wait_ms=0"
            answer = asyncio.run(_ask(served.port, _get(path)))
            assert f'"value":"{value}"'.encode() in answer, (served.port, i, answer)
    assert fast.taken - before == 10, "the fast service's zero-wait polls took the fast path"


def test_a_long_poll_from_the_log_end_right_after_a_produce_is_in_range_not_416(
    fast: Served, slow: Served, kafka_topic_factory: object
) -> None:
    # A produce answered offset n: n + 1 is the log's end, a fetch offset Kafka accepts (it
    # waits there). The change feed may still report n as the high watermark for a few ms.
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    for served in (fast, slow):
        _warm(served.port, topic)
    for served in (fast, slow):
        for i in range(20):
            offset = _produce(served.port, topic, "v")
            wait_ms = 0 if i % 2 else 20
            path = f"/topics/{topic}/partitions/0/records?offset={offset + 1}&max_wait_ms={wait_ms}"
            at_end = asyncio.run(_ask(served.port, _get(path)))
            assert at_end.startswith(b"HTTP/1.1 200 "), (served.port, i, at_end)
            assert b'"records":[]' in at_end, "nothing past the end"
        # Past the end by more than the feed can lag: 416 at once, as Kafka answers.
        beyond = _get(f"/topics/{topic}/partitions/0/records?offset={offset + 50}&max_wait_ms=30000")
        started = time.monotonic()
        assert asyncio.run(_ask(fast.port, beyond)).startswith(b"HTTP/1.1 416 ")
        assert time.monotonic() - started < WAIT_S / 2, "answered without waiting its max_wait_ms"


# -- connections ----------------------------------------------------------------------------------


def test_a_client_leaving_while_waiting_releases_its_operation(
    fast: Served, kafka_topic_factory: object
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    _warm(fast.port, topic)
    purgatory = fast.app.state.gateway.fetch_purgatory
    connections = fast.server.server.server_state.connections

    async def leave() -> None:
        conn = await RawConnection.open(fast.port)
        conn.send(_get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=60000"))
        await until(lambda: fast.pending == 1, "the long poll waiting")
        (ours,) = [c for c in connections if getattr(c, "_parked", None) is not None]
        await conn.close()
        # Released at once (not at its 60 s max_wait_ms): out of the timer, and the connection
        # (its protocol, which held the operation) is forgotten by the server.
        await until(lambda: fast.pending == 0, "the abandoned long poll released", timeout_s=5.0)
        await until(lambda: ours not in connections, "the connection forgotten", timeout_s=5.0)
        assert getattr(ours, "_parked", None) is None

    before, cancelled = fast.taken, purgatory.stats.cancelled
    asyncio.run(leave())
    assert fast.taken == before + 1
    assert purgatory.stats.cancelled == cancelled + 1  # finished CANCELLED, as the ASGI path does


def test_a_kept_alive_connection_serves_long_polls_and_pipelined_requests_in_order(
    fast: Served, kafka_topic_factory: object
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    _produce(fast.port, topic, "x", "y")
    _warm(fast.port, topic)

    async def keep_alive() -> list[bytes]:
        conn = await RawConnection.open(fast.port)
        try:
            conn.send(_get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=5000"))
            first = await conn.response()
            # A long poll that waits, with another request pipelined behind it on the connection.
            conn.send(
                _get(f"/topics/{topic}/partitions/0/records?offset=2&max_wait_ms=30000")
                + _get(f"/topics/{topic}/partitions/0/records?offset=1&max_wait_ms=0")
            )
            await until(lambda: fast.pending >= 1, "the second long poll waiting")
            await asyncio.to_thread(_produce, fast.port, topic, "z")
            return [first, await conn.response(), await conn.response()]
        finally:
            await conn.close()

    before = fast.taken
    first, second, third = asyncio.run(keep_alive())
    assert b'"value":"x"' in first and b'"value":"y"' in first
    assert b'"value":"z"' in second and b'"next_offset":3' in second
    assert b'"fetch_offset":1' in third  # answered after the one before it, on the same connection
    # All three on the fast path: the pipelined one waited in h11's buffer for the answer before it.
    assert fast.taken - before == 3


def test_an_answered_connection_holds_no_h11_state_and_closes_at_the_keep_alive_timeout(
    fast: Served, kafka_topic_factory: object
) -> None:
    """After a fast-path answer the connection waits for its next request with no h11 state and a
    keep-alive timeout shared with its burst (CoalescedTimers): it must still close at uvicorn's
    timeout (5 s), not before, and a request sent meanwhile would start a fresh h11 state."""
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    _produce(fast.port, topic, "x")
    _warm(fast.port, topic)
    connections = fast.server.server.server_state.connections
    keep_alive_s = fast.server.server.config.timeout_keep_alive

    async def answered_then_idle() -> tuple[bytes, list[object], float, bytes]:
        conn = await RawConnection.open(fast.port)
        try:
            conn.send(_get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=5000"))
            answer = await conn.response()
            answered = time.monotonic()
            states = [getattr(c, "conn", "?") for c in list(connections)]
            async with asyncio.timeout(keep_alive_s + WAIT_S):
                tail = await conn.reader.read()  # EOF: the service closed the idle connection
            return answer, states, time.monotonic() - answered, tail
        finally:
            await conn.close()

    answer, states, idle_s, tail = asyncio.run(answered_then_idle())
    assert b'"value":"x"' in answer
    assert None in states, "the answered connection holds no h11 state while idle"
    assert tail == b"", "closed without another byte"
    assert idle_s >= keep_alive_s - 0.1, f"closed after {idle_s:.2f} s: not before the keep-alive timeout"


# -- authentication -------------------------------------------------------------------------------


@pytest.mark.parametrize("fast_long_poll", [True, False], ids=["fast", "asgi"])
def test_authentication_is_asked_the_same_way(
    kafka_settings: KafkaSettings, kafka_topic_factory: object, fast_long_poll: bool
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    with _served(kafka_settings, auth_tokens=[TOKEN], fast_long_poll=fast_long_poll) as served:
        good = f"authorization: Bearer {TOKEN}"
        _warm(served.port, topic, good)
        path = f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=0"
        refused = asyncio.run(_ask(served.port, _get(path)))
        wrong = asyncio.run(_ask(served.port, _get(path, "authorization: Bearer nope")))
        answered = asyncio.run(_ask(served.port, _get(path, good)))
        assert refused.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and b"www-authenticate: Bearer" in refused
        assert wrong == refused
        assert answered.startswith(b"HTTP/1.1 200 OK\r\n")
        # The authenticated one on the fast path; the refusals went through ASGI.
        assert served.taken == (1 if fast_long_poll else 0)
        assert (served.long_poll is None) is not fast_long_poll


# -- the setting ----------------------------------------------------------------------------------


def test_the_fast_path_is_a_setting() -> None:
    assert ServiceSettings().fast_long_poll is True
    on = uvicorn_options(ServiceSettings())["http"]
    off = uvicorn_options(ServiceSettings(fast_long_poll=False))["http"]
    assert issubclass(on, LongPollH11Protocol)
    assert issubclass(off, HeadTimeoutH11Protocol) and not issubclass(off, LongPollH11Protocol)
    # Both keep the bound on a request head's time.
    assert on.head_timeout_s == off.head_timeout_s == ServiceSettings().head_read_timeout_ms / 1000


def test_shutdown_answers_a_parked_long_poll_then_closes(
    kafka_settings: KafkaSettings, kafka_topic_factory: object
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    with _served(kafka_settings) as served:
        _warm(served.port, topic)
        answer, rest = asyncio.run(_park_then_stop(served, topic))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"outcome":"EXPIRED"' in answer
    assert rest == b""


async def _park_then_stop(served: Served, topic: str) -> tuple[bytes, bytes]:
    conn = await RawConnection.open(served.port)
    conn.send(_get(f"/topics/{topic}/partitions/0/records?offset=0&max_wait_ms=60000"))
    await until(lambda: served.pending == 1, "the long poll waiting")
    assert served.taken == 1
    await asyncio.to_thread(served.server.stop)  # graceful (1 s), then the drain answers it
    answer = await conn.response()
    rest = await asyncio.wait_for(conn.reader.read(), WAIT_S)  # then the connection closes
    await conn.close()
    return answer, rest


def test_a_long_poll_over_mutual_tls_takes_the_fast_path(
    kafka_settings: KafkaSettings,
    kafka_topic_factory: object,
    pki: Pki,  # noqa: F811
) -> None:
    """TLS lives in the transport, below the protocol: the fast path serves HTTPS the same way."""
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    tls = {
        "tls_certfile": str(pki.server_cert),
        "tls_keyfile": str(pki.server_key),
        "tls_ca_certs": str(pki.ca),
        "tls_client_auth": "required",
    }
    with _served(kafka_settings, **tls) as served:
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        with httpx.Client(base_url=served.server.url, verify=context, timeout=WAIT_S) as client:
            produced = client.post(f"/topics/{topic}/records", json={"records": [{"value": "tls"}]})
            assert produced.status_code == 200, produced.text
            path = f"/topics/{topic}/partitions/0/records"
            client.get(path, params={"offset": 0, "max_wait_ms": 0})  # metadata cached
            before = served.taken
            answer = client.get(path, params={"offset": 0, "max_wait_ms": 5000})
        assert answer.status_code == 200 and answer.json()["records"][0]["value"] == "tls"
        assert served.taken == before + 1
