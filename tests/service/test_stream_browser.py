"""A real browser's ``EventSource`` on ``GET .../stream``: it receives the events and resumes after
the service restarts, from ``Last-Event-ID``, without loss or duplicates.

Headless Chromium (Debian's ``/usr/bin/chromium``; ``.ci/run`` installs it) driven by playwright.
The page is given the service's own origin (playwright answers its navigation, the service is
not asked), so the stream is a same-origin request as from a page the service's host would serve.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.server._server import BackgroundServer
from purgatory.adapters.service.settings import ServiceSettings

from purgatory.settings import Settings

from .conftest import WAIT_S

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = int(WAIT_S * 1000)

# The page: one EventSource, every event's id and values kept in order, every (re)open counted.
PAGE = """<!doctype html><meta charset="utf-8"><title>stream</title><script>
window.received = []; window.opens = 0; window.overflows = 0;
const source = new EventSource(new URLSearchParams(location.search).get("stream"));
source.onopen = () => { window.opens += 1; };
source.onmessage = (e) => {
  const batch = JSON.parse(e.data);
  for (const r of batch.records) window.received.push([e.lastEventId, r.offset, r.value]);
};
source.addEventListener("overflow", () => { window.overflows += 1; });
</script>"""


@pytest.fixture
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()  # playwright ends the browser process it started


def _produce(url: str, topic: str, *values: str) -> None:
    with httpx.Client(base_url=url, timeout=WAIT_S) as client:
        answer = client.post(f"/topics/{topic}/records", json={"records": [{"value": v} for v in values]})
        assert answer.status_code == 200, answer.text


def test_event_source_receives_the_events_and_resumes_after_the_service_restarts(
    browser: Any, kafka_settings: KafkaSettings, kafka_topic_factory: Any
) -> None:
    topic = kafka_topic_factory(1)
    settings = Settings(kafka=kafka_settings, service=ServiceSettings(stream_retry_ms=200))
    # Two services on the same Kafka: the browser streams from ``streamed`` (stopped, then started
    # again on its port); ``producer`` appends, also while ``streamed`` is down.
    with BackgroundServer(create_app(settings), graceful_shutdown_s=1) as producer:
        streamed = BackgroundServer(create_app(settings), graceful_shutdown_s=1).start()
        port = streamed.port
        try:
            _produce(producer.url, topic, "a", "b")
            page = browser.new_page()
            origin = f"http://127.0.0.1:{port}"
            page_url = f"{origin}/page?stream=/topics/{topic}/partitions/0/stream%3Foffset%3D0"
            page.route(page_url, lambda route: route.fulfill(body=PAGE, content_type="text/html"))
            page.goto(page_url)
            page.wait_for_function("window.received.length === 2", timeout=WAIT_MS)
            _produce(producer.url, topic, "c")
            page.wait_for_function("window.received.length === 3", timeout=WAIT_MS)

            streamed.stop()  # the stream's connection drops with its service
            _produce(producer.url, topic, "d")  # appended while the browser is disconnected
            streamed = BackgroundServer(create_app(settings), port=port, graceful_shutdown_s=1).start()
            page.wait_for_function("window.opens >= 2 && window.received.length === 4", timeout=WAIT_MS)
            _produce(producer.url, topic, "e")
            page.wait_for_function("window.received.length === 5", timeout=WAIT_MS)

            received = page.evaluate("window.received")
            assert [value for _, _, value in received] == ["a", "b", "c", "d", "e"], "no loss, no duplicate"
            assert [offset for _, offset, _ in received] == [0, 1, 2, 3, 4]
            assert [event_id for event_id, _, _ in received] == ["2", "2", "3", "4", "5"], "id: next offset"
            assert page.evaluate("window.overflows") == 0
        finally:
            streamed.stop()
