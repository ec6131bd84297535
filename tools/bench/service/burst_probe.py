"""BurstProbe: how long a produce and a ``/healthz`` wait when sent as a fan-out burst begins.

Issue 30: "a produce (and /healthz) sent at the moment of a 10,000-answer burst is answered within
100 ms". The burst begins when the first long poll is answered; this probe's thread watches a
sample of the polls (every :data:`SAMPLE_EVERY`-th: the service answers in batches, so a sampled
poll is answered within the burst's first batch or so) and, once one is answered, sends a
``GET /healthz`` and then a ``POST /topics/{t}/records`` (one small record, to a topic of its
own: the long polls' partitions are not written) on connections it opened and warmed beforehand
— no connect in the figures, and the service's producer has appended once already (a first
append's set-up costs are no burst's doing). Each figure is from the send to the answer's last
byte; ``started_after_ms`` says how long after the first sampled answer they were sent.

Bounded: the thread waits at most ``timeout_s`` for the burst, each request has the same bound,
and it is joined by the case. Loopback only.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Sequence
from typing import Protocol

__all__ = ["BurstProbe"]

SAMPLE_EVERY = 97  # polls watched: ~100 of 10,000
POLL_INTERVAL_S = 0.0005


class _Answered(Protocol):
    @property
    def answered_ns(self) -> int: ...  # 0 until answered


class BurstProbe(threading.Thread):
    """Sends a /healthz and a produce as the burst begins; ``healthz_ms``, ``produce_ms`` after join."""

    def __init__(self, port: int, topic: str, polls: Sequence[_Answered], timeout_s: float) -> None:
        super().__init__(name="burst-probe", daemon=True)
        self.topic = topic
        self.polls = polls[::SAMPLE_EVERY] or polls
        self.timeout_s = timeout_s
        self.healthz_ms = float("nan")
        self.produce_ms = float("nan")
        self.started_after_ms = float("nan")
        self.error: str | None = None
        self._health = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        self._produce = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        self._body = json.dumps({"records": [{"value": "burst-probe"}]}).encode()
        self._get_health()  # warmed: connected, the routes' first call made
        self._post_produce()  # to its own topic: the long polls' partitions are not written

    def _get_health(self) -> None:
        self._health.request("GET", "/healthz")
        self._health.getresponse().read()

    def _post_produce(self) -> None:
        headers = {"content-type": "application/json"}
        self._produce.request("POST", f"/topics/{self.topic}/records", body=self._body, headers=headers)
        response = self._produce.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"the probe's produce answered {response.status}")

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            first_ns = 0
            while time.monotonic() < deadline:
                first_ns = min((p.answered_ns for p in self.polls if p.answered_ns), default=0)
                if first_ns:
                    break
                time.sleep(POLL_INTERVAL_S)
            if not first_ns:
                self.error = "no answer within the probe's bound"
                return
            sent = time.monotonic_ns()
            self.started_after_ms = (sent - first_ns) / 1e6
            self._get_health()
            self.healthz_ms = (time.monotonic_ns() - sent) / 1e6
            sent = time.monotonic_ns()
            self._post_produce()
            self.produce_ms = (time.monotonic_ns() - sent) / 1e6
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            self.error = str(exc)[:200]
        finally:
            self._health.close()
            self._produce.close()
