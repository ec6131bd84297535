"""SIGTERM to a uvicorn service built on KafkaPurgatory: every waiting caller gets a clean 503
within a second, none a 500, none hangs (issue "Embedding in practice", item 3).

uvicorn's graceful shutdown waits for the in-flight requests before it runs the lifespan's exit;
without ``kp.drain_on_signals()`` the waits ran to their own timeout (30 s), and past
``--timeout-graceful-shutdown`` uvicorn cancelled them: 500s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from purgatory.adapters.kafka.local import free_port

from .kafka_fixtures import WAIT_S, create_topic

pytestmark = pytest.mark.kafka

pytest.importorskip("fastapi")

CALLERS = 200
CALLER_WAIT_MS = 30_000  # the callers' own wait: far longer than the shutdown may take
GRACEFUL_S = 3  # uvicorn --timeout-graceful-shutdown, as the user ran it
ANSWER_BUDGET_S = 1.0  # every caller is answered within this of SIGTERM
# Slack on a shared 2-core machine: 200 responses written and read back by one Python client.
SCHEDULING_SLACK_S = 0.5
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(kafka_bootstrap: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    suffix = uuid.uuid4().hex[:8]
    topic = create_topic(kafka_bootstrap, f"orders-{suffix}", partitions=1)
    port = free_port()
    env = {
        **os.environ,
        "PURGATORY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ORDERS_TOPIC": topic,
        "ORDERS_GROUP": f"billing-{suffix}",
        "PYTHONPATH": str(ROOT),
    }
    command = [
        sys.executable, "-m", "uvicorn", "--factory", "tests.kafka.shutdown_app:create_app",
        "--host", "127.0.0.1", "--port", str(port),
        "--timeout-graceful-shutdown", str(GRACEFUL_S), "--log-level", "warning",
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.kill()  # by the PID this test started
        process.wait(WAIT_S)


async def _wait_for(
    client: httpx.AsyncClient, path: str, expected: object, process: subprocess.Popen[bytes]
) -> None:
    """Poll ``path`` until it answers ``expected`` (the service has no event to await from outside)."""
    deadline = time.monotonic() + WAIT_S * 2
    last: object = None
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the service exited early ({process.returncode})"
        try:
            response = await client.get(path)
            last = response.json() if response.status_code == 200 else response.status_code
            if last == expected:
                return
        except httpx.TransportError as exc:  # not listening yet
            last = exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never answered {expected!r} (last: {last!r})")


async def test_sigterm_answers_every_waiting_caller_503_within_a_second(
    service: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = service
    limits = httpx.Limits(max_connections=CALLERS + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(CALLER_WAIT_MS / 1000 + WAIT_S)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        await _wait_for(client, "/pending", 0, process)
        answered_at: list[float] = []

        async def caller() -> httpx.Response:
            response = await client.get(
                "/orders/wait", params={"offset": 10**6, "timeout_ms": CALLER_WAIT_MS}
            )
            answered_at.append(time.monotonic())
            return response

        callers = [asyncio.ensure_future(caller()) for _ in range(CALLERS)]
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as probe:
            await _wait_for(probe, "/pending", CALLERS, process)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        done, hanging = await asyncio.wait(callers, timeout=GRACEFUL_S + WAIT_S)

    assert not hanging, f"{len(hanging)} callers never got an answer"
    responses = [task.result() for task in done]
    codes = sorted({r.status_code for r in responses})
    assert codes == [503], f"every caller gets 503 (no 500, no 504), got {codes}"
    assert all(r.headers.get("retry-after") == "1" for r in responses), "503 carries Retry-After"
    assert {r.json()["detail"] for r in responses} == {"SHUTTING_DOWN"}
    slowest = max(answered_at) - sent
    assert slowest < ANSWER_BUDGET_S + SCHEDULING_SLACK_S, (
        f"every caller answered within {ANSWER_BUDGET_S} s of SIGTERM; the last after {slowest:.2f} s"
    )
    process.wait(WAIT_S)  # then the process exits on its own (uvicorn re-raises SIGTERM)
    assert process.returncode in (0, -signal.SIGTERM), f"exit status {process.returncode}"
