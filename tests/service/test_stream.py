"""``GET /topics/{t}/partitions/{p}/stream`` (Server-Sent Events) against real Kafka.

Both paths are checked: the service's own HTTP/1.1 fast path (``fast``: the connection is handed
to an :class:`SseConnection`) and the ASGI route (``slow``: ``fast_long_poll`` off). Streams are
read as raw bytes over a socket, parsed as an ``EventSource`` parses them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service.settings import AdmissionSettings, ServiceSettings

from purgatory.settings import Settings

from .conftest import WAIT_S, Served, serving, until

TOKEN = "token-stream-5c1a"


@contextmanager
def _served(
    kafka: KafkaSettings, admission: dict[str, Any] | None = None, **service: object
) -> Iterator[Served]:
    settings = Settings(
        kafka=kafka,
        service=ServiceSettings.model_validate(service),
        admission=AdmissionSettings.model_validate(admission or {}),
    )
    with serving(settings) as served:
        yield served


@pytest.fixture(scope="module", params=["fast", "asgi"])
def served(request: pytest.FixtureRequest, kafka_settings: KafkaSettings) -> Iterator[Served]:
    with _served(kafka_settings, fast_long_poll=request.param == "fast", stream_heartbeat_ms=300) as s:
        yield s


def _produce(served: Served, topic: str, *values: str) -> None:
    with httpx.Client(base_url=served.url, timeout=WAIT_S) as client:
        answer = client.post(f"/topics/{topic}/records", json={"records": [{"value": v} for v in values]})
        assert answer.status_code == 200, answer.text


class EventReader:
    """One stream over a raw socket: the response head, then events parsed as EventSource does."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.head = b""
        self.comments = 0
        self._chunked = False

    @classmethod
    async def open(cls, served: Served, path: str, *headers: str) -> EventReader:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port, limit=1 << 20)
        lines = [f"GET {path} HTTP/1.1", "host: 127.0.0.1", "accept: text/event-stream", *headers, "", ""]
        writer.write("\r\n".join(lines).encode())
        stream = cls(reader, writer)
        async with asyncio.timeout(WAIT_S):
            stream.head = await reader.readuntil(b"\r\n\r\n")
        stream._chunked = b"transfer-encoding: chunked" in stream.head.lower()
        return stream

    @property
    def status(self) -> int:
        return int(self.head[9:12])

    async def body(self) -> bytes:
        """An error answer's body (Content-Length framed)."""
        length = int(self.head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        async with asyncio.timeout(WAIT_S):
            return await self.reader.readexactly(length)

    async def _line(self) -> bytes:
        if self._chunked and not getattr(self, "_buffer", b""):
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            self._buffer = await self.reader.readexactly(size + 2)
            self._buffer = self._buffer[:-2]
        if self._chunked:
            line, sep, rest = self._buffer.partition(b"\n")
            while not sep:  # an event split over chunks
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                self._buffer += (await self.reader.readexactly(size + 2))[:-2]
                line, sep, rest = self._buffer.partition(b"\n")
            self._buffer = rest
            return line
        return (await self.reader.readuntil(b"\n"))[:-1]

    async def event(self, timeout_s: float = WAIT_S) -> dict[str, str]:
        """The next event's fields (comments counted, ``retry`` kept); {} at the end of the stream."""
        fields: dict[str, str] = {}
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    line = await self._line()
                except asyncio.IncompleteReadError:
                    return fields
                if not line:
                    if fields:
                        return fields
                    continue
                if line.startswith(b":"):
                    self.comments += 1
                    continue
                name, _, value = line.decode().partition(":")
                fields[name] = value.removeprefix(" ")

    async def records_event(self) -> dict[str, str]:
        """The next event that carries records (retry fields and heartbeats skipped)."""
        while True:
            event = await self.event()
            if "data" in event or not event:
                return event

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _values(event: dict[str, str]) -> list[str]:
    return [r["value"] for r in json.loads(event["data"])["records"]]


def test_a_stream_sends_each_batch_as_an_event_whose_id_is_the_next_offset(
    served: Served, kafka_topic_factory: Any
) -> None:
    topic = kafka_topic_factory(1)
    _produce(served, topic, "a", "b")

    async def run() -> None:
        stream = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream?offset=0")
        assert stream.status == 200
        assert b"content-type: text/event-stream" in stream.head
        first = await stream.records_event()
        assert first["id"] == "2" and _values(first) == ["a", "b"], first
        await asyncio.to_thread(_produce, served, topic, "c")
        second = await stream.records_event()
        assert second["id"] == "3" and _values(second) == ["c"], second
        await stream.close()

    asyncio.run(run())


def test_last_event_id_resumes_after_the_events_received_and_wins_over_the_query(
    served: Served, kafka_topic_factory: Any
) -> None:
    topic = kafka_topic_factory(1)
    _produce(served, topic, "a", "b", "c")

    async def run() -> None:
        stream = await EventReader.open(
            served, f"/topics/{topic}/partitions/0/stream?offset=0", "last-event-id: 2"
        )
        event = await stream.records_event()
        assert event["id"] == "3" and _values(event) == ["c"], "resumed at 2, not the query's 0"
        await stream.close()
        by_query = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream?offset=1")
        event = await by_query.records_event()
        assert _values(event) == ["b", "c"]
        await by_query.close()

    asyncio.run(run())


def test_an_idle_stream_gets_heartbeats(served: Served, kafka_topic_factory: Any) -> None:
    topic = kafka_topic_factory(1)

    async def run() -> None:
        stream = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream")
        assert stream.status == 200
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.5):
                await stream.records_event()  # nothing but the retry field and comments arrives
        assert stream.comments >= 2, "heartbeats every 300 ms"
        await stream.close()

    asyncio.run(run())


def test_streams_at_one_position_share_one_poll_and_catch_up_from_behind(
    served: Served, kafka_topic_factory: Any
) -> None:
    topic = kafka_topic_factory(1)
    _produce(served, topic, "a")

    async def run() -> None:
        at_end = [await EventReader.open(served, f"/topics/{topic}/partitions/0/stream") for _ in range(20)]
        hub = served.app.state.stream_hub
        await until(lambda: hub.streams == 20, "20 streams joined")
        assert hub.describe()[f"{topic}-0"]["positions"] == [1], "one group at the end"
        behind = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream?offset=0")
        assert _values(await behind.records_event()) == ["a"]
        await until(lambda: hub.streams == 21, "the stream behind joined")
        async with httpx.AsyncClient(base_url=served.url, timeout=WAIT_S) as client:
            metrics = (await client.get("/metrics")).text
        assert "\npurgatory_service_event_streams 21.0\n" in metrics
        await asyncio.to_thread(_produce, served, topic, "b")
        for stream in [*at_end, behind]:
            event = await stream.records_event()
            assert event["id"] == "2" and _values(event) == ["b"]
        # The hub lives on the server's thread: it moves the group on right after writing the
        # events, which this thread may have read before that step ran.
        await until(lambda: hub.describe()[f"{topic}-0"]["positions"] == [2], "merged into one group at 2")
        for stream in [*at_end, behind]:
            await stream.close()
        await until(lambda: hub.streams == 0, "streams left the hub when their clients left")

    asyncio.run(run())


def test_refusals_are_the_long_polls(served: Served, kafka_topic_factory: Any) -> None:
    topic = kafka_topic_factory(1)
    _produce(served, topic, "a")

    async def refusal(path: str, *headers: str) -> tuple[int, dict[str, Any]]:
        stream = await EventReader.open(served, path, *headers)
        status, body = stream.status, json.loads(await stream.body())
        await stream.close()
        return status, body

    async def run() -> None:
        assert (await refusal("/topics/_private/partitions/0/stream"))[0] == 403
        assert (await refusal(f"/topics/{topic}/partitions/9/stream"))[0] == 404
        status, body = await refusal(f"/topics/{topic}/partitions/0/stream?offset=99")
        assert (status, body["error"]) == (416, "OFFSET_OUT_OF_RANGE")
        status, body = await refusal(f"/topics/{topic}/partitions/0/stream?bogus=1")
        assert (status, body["field"]) == (400, "bogus")
        status, body = await refusal(f"/topics/{topic}/partitions/0/stream", "last-event-id: x")
        assert (status, body["field"]) == (400, "Last-Event-ID")

    asyncio.run(run())


def test_auth_and_admission_refuse_a_stream(kafka_settings: KafkaSettings, kafka_topic_factory: Any) -> None:
    topic = kafka_topic_factory(1)
    with _served(kafka_settings, {"max_waiters_per_key": 1}, auth_tokens=[TOKEN]) as served:
        auth = f"authorization: Bearer {TOKEN}"

        async def run() -> None:
            anonymous = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream")
            assert anonymous.status == 401
            await anonymous.close()
            first = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream", auth)
            assert first.status == 200
            hub = served.app.state.stream_hub
            await until(lambda: hub.streams == 1, "the first stream joined")
            second = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream", auth)
            assert second.status == 429 and b"retry-after: 1" in second.head.lower()
            for stream in (first, second):
                await stream.close()

        asyncio.run(run())


def test_a_reader_past_its_buffer_gets_an_overflow_event_naming_where_to_resume(
    kafka_settings: KafkaSettings, kafka_topic_factory: Any
) -> None:
    topic = kafka_topic_factory(1)
    with _served(kafka_settings, stream_buffer_bytes=4096) as served:

        async def run() -> None:
            # A client that does not read: its socket buffers fill, then the service's bound.
            stream = await EventReader.open(served, f"/topics/{topic}/partitions/0/stream")
            hub = served.app.state.stream_hub
            await until(lambda: hub.streams == 1, "the stream joined")
            value = "x" * 50_000
            for _ in range(200):
                await asyncio.to_thread(_produce, served, topic, value)
                if hub.streams == 0:
                    break
            assert hub.streams == 0, "the slow stream ended"
            last: dict[str, str] = {}
            while True:  # read what was buffered: events, then the overflow, then the end
                event = await stream.event()
                if not event:
                    break
                last = event
            assert last.get("event") == "overflow", last
            resume = json.loads(last["data"])["next_offset"]
            assert last["id"] == str(resume) and resume > 0
            await stream.close()

        asyncio.run(run())


def test_a_stream_over_http2_is_refused_with_505_not_held(served: Served, kafka_topic_factory: Any) -> None:
    topic = kafka_topic_factory(1)
    with httpx.Client(base_url=served.url, http1=False, http2=True, timeout=WAIT_S) as client:
        answer = client.get(f"/topics/{topic}/partitions/0/stream")
    assert answer.http_version == "HTTP/2"
    assert (answer.status_code, answer.json()["error"]) == (505, "HTTP_VERSION_NOT_SUPPORTED")
