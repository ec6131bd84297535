"""Pipelined mixes of long polls and other requests on one HTTP/1.1 connection: every one answered,
in order, with nothing logged as an error.

A long poll pipelined behind a request the ASGI app serves is read inside uvicorn's
``on_response_complete``; the fast path parks it there and lets go of h11's state — the head
timer must not read that state afterwards (it did: AttributeError, connection closed, the poll
never answered). A long poll pipelined behind a parked one is read after that one's answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from structlog.testing import capture_logs

from purgatory.settings import Settings

from .conftest import Served, serving, until
from .test_long_poll import RawConnection, _get, _produce, _warm

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def fast(kafka_settings: KafkaSettings) -> Iterator[Served]:
    with serving(Settings(kafka=kafka_settings)) as served:
        yield served


@contextmanager
def _no_errors_logged() -> Iterator[None]:
    """Fails if uvicorn, asyncio or structlog logged an error meanwhile (uvicorn's loggers do not
    propagate to the root: a handler of our own on each)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(logging.ERROR)
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "asyncio")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with capture_logs() as events:
            yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert not records, [r.getMessage() for r in records]
    assert not [e for e in events if e["log_level"] in ("error", "critical")], events


def _post(path: str, document: dict[str, Any]) -> bytes:
    body = json.dumps(document).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    return head.encode() + b"content-length: %d\r\n\r\n" % len(body) + body


def _status(response: bytes) -> int:
    return int(response[9:12])


def _pipelined(served: Served, topic: str, first: bytes, second: bytes, waiting: int) -> list[bytes]:
    """Send ``first`` and ``second`` in one write; once ``waiting`` polls wait, produce a record
    from another connection; both answers, in order."""

    async def run() -> list[bytes]:
        conn = await RawConnection.open(served.port)
        try:
            conn.send(first + second)
            if waiting:
                await until(lambda: served.pending >= waiting, f"{waiting} long poll(s) waiting")
                await asyncio.to_thread(_produce, served.port, topic, "new")
            return [await conn.response(), await conn.response()]
        finally:
            await conn.close()

    with _no_errors_logged():
        return asyncio.run(run())


def _poll(topic: str, offset: int, wait_ms: int = 30_000) -> bytes:
    return _get(f"/topics/{topic}/partitions/0/records?offset={offset}&max_wait_ms={wait_ms}")


@pytest.fixture
def topic(fast: Served, kafka_topic_factory: Any) -> str:
    name: str = kafka_topic_factory(1)
    _produce(fast.port, name, "old")  # offset 0; the polls below wait at offset 1
    _warm(fast.port, name)
    return name


def test_pipelined_healthz_then_poll_are_answered_in_order(fast: Served, topic: str) -> None:
    before = fast.taken
    health, poll = _pipelined(fast, topic, _get("/healthz"), _poll(topic, 1), waiting=1)
    assert _status(health) == 200 and b'"status":"ok"' in health
    assert _status(poll) == 200 and b'"value":"new"' in poll, poll
    assert fast.taken - before == 1, "the poll read after the ASGI answer took the fast path"


def test_pipelined_poll_then_healthz_are_answered_in_order(fast: Served, topic: str) -> None:
    poll, health = _pipelined(fast, topic, _poll(topic, 1), _get("/healthz"), waiting=1)
    assert _status(poll) == 200 and b'"value":"new"' in poll, poll
    assert _status(health) == 200 and b'"status":"ok"' in health


def test_pipelined_poll_then_poll_are_answered_in_order(fast: Served, topic: str) -> None:
    # The second waits for the first's answer (pipelining), then is answered at once: offset 0.
    first, second = _pipelined(fast, topic, _poll(topic, 1), _poll(topic, 0), waiting=1)
    assert b'"value":"new"' in first and b'"fetch_offset":1' in first, first
    assert b'"fetch_offset":0' in second and b'"value":"old"' in second, second


def test_pipelined_poll_then_waiting_poll_are_answered_in_order(fast: Served, topic: str) -> None:
    # Both wait: the second is parked only after the first's answer, and expires on its own.
    first, second = _pipelined(fast, topic, _poll(topic, 1), _poll(topic, 2, wait_ms=200), waiting=1)
    assert b'"value":"new"' in first, first
    assert b'"outcome":"EXPIRED"' in second and b'"records":[]' in second, second


def test_pipelined_poll_then_produce_are_answered_in_order(fast: Served, topic: str) -> None:
    produce = _post(f"/topics/{topic}/records", {"records": [{"value": "pipelined"}]})
    poll, produced = _pipelined(fast, topic, _poll(topic, 1), produce, waiting=1)
    assert b'"value":"new"' in poll, poll
    assert _status(produced) == 200, produced


def test_pipelined_produce_then_poll_are_answered_in_order(fast: Served, topic: str) -> None:
    produce = _post(f"/topics/{topic}/records", {"records": [{"value": "first"}]})
    produced, poll = _pipelined(fast, topic, produce, _poll(topic, 1), waiting=0)
    assert _status(produced) == 200, produced
    assert b'"value":"first"' in poll, "the poll read after the produce's answer sees its record"


def test_pipelined_poll_poll_healthz_poll_are_answered_in_order(fast: Served, topic: str) -> None:
    async def run() -> list[bytes]:
        conn = await RawConnection.open(fast.port)
        try:
            conn.send(_poll(topic, 1) + _poll(topic, 0) + _get("/healthz") + _poll(topic, 0, wait_ms=0))
            await until(lambda: fast.pending >= 1, "the first long poll waiting")
            await asyncio.to_thread(_produce, fast.port, topic, "new")
            return [await conn.response() for _ in range(4)]
        finally:
            await conn.close()

    with _no_errors_logged():
        answers = asyncio.run(run())
    assert [_status(a) for a in answers] == [200, 200, 200, 200]
    assert b'"fetch_offset":1' in answers[0] and b'"status":"ok"' in answers[2]
    assert b'"fetch_offset":0' in answers[1] and b'"fetch_offset":0' in answers[3]
