"""A rogue member of the ownership group gets nothing: no forwarded request, no token, no client.

Issue 31 item 11: a plain consumer joining the service's group with ``client.id=<its URL>`` was
assigned partitions, and the instances forwarded authenticated clients' long polls to it with
their ``Authorization`` header (or redirected clients there). Here, with real Kafka and two
genuine instances sharing ``scaleout.secret`` (one in forward mode, one in redirect mode), a
plain confluent-kafka consumer joins the group with the URL of a small HTTP server on loopback
that records every request it receives:

* with a forged ``client.id`` (its own URL, no proof), and
* with a ``client.id`` copied from a genuine instance (proof included, read off the group's
  description, as anyone allowed to describe the group can).

Every partition is asked at both instances with the caller's bearer token: each is answered
(200 from an instance, or a 307 to the *other genuine* instance that then answers 200), no
``Location`` names the rogue, and the rogue's server receives no request at all.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from purgatory.adapters.service.instances import Instance, LocalInstances

from tests.kafka.kafka_fixtures import create_topic, wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 6
TOKEN = "rogue-test-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
SETTLE_S = 60.0
POLL_S = 0.1


class RecordingServer:
    """An HTTP server on 127.0.0.1 that answers 200 to anything and records what it received."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        received = self.received

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self) -> None:
                received.append({"method": self.command, "path": self.path, "headers": dict(self.headers)})
                body = b'{"rogue": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _record

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="rogue-http", daemon=True)

    def __enter__(self) -> RecordingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class RogueMember:
    """A plain consumer in the group with a client.id of the test's choosing; polls on a thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, client_id: str) -> None:
        self.assigned: set[int] = set()
        # Set on the polling thread: consumer.memberid() called from the test's thread while
        # this one polled hung the test (seen once); nothing here calls into it from outside.
        self.member_id: str | None = None
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": client_id,
                "partition.assignment.strategy": "cooperative-sticky",  # the group's protocol
                "session.timeout.ms": "6000",
                "heartbeat.interval.ms": "1000",
                "enable.auto.commit": False,
                "log_level": "0",
            }
        )
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.thread = threading.Thread(target=self._run, name="rogue-member", daemon=True)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        self.member_id = consumer.memberid()
        self.assigned |= {tp.partition for tp in partitions}

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned -= {tp.partition for tp in partitions}

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(POLL_S)  # serves the rebalance callbacks (heartbeats run anyway)

    def __enter__(self) -> RogueMember:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(10)
        self.consumer.close()


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    return create_topic(kafka_bootstrap, f"rogue-{uuid.uuid4().hex[:8]}", PARTITIONS, 1)


@pytest.fixture
def fleet(kafka_bootstrap: str, topic: str, tmp_path: Path) -> Iterator[LocalInstances]:
    env = {"PURGATORY_SERVICE__AUTH_TOKENS": json.dumps([TOKEN])}
    with LocalInstances(
        kafka_bootstrap,
        topics=[topic],
        group_id=f"g-{topic}",
        env=env,
        log_dir=tmp_path,
        session_timeout_ms=6000,
    ) as instances:
        yield instances


def settled_with_rogue(fleet: LocalInstances, rogue: RogueMember, rogue_url: str) -> dict[str, Any]:
    """Both instances see 3 members, all partitions assigned, the rogue holding some; its /owners."""
    seen: dict[str, Any] = {}

    def stable() -> bool:
        documents = [fleet.owners(i, BEARER) for i in fleet.running()]
        for document in documents:
            if document["state"] != "STABLE" or len(document["members"]) != 3:
                return False
            held = [p for m in document["members"] for p in m["partitions"]]
            if len(held) != PARTITIONS:
                return False
            mine = [
                set(m["partitions"]) for m in document["members"] if m["member_id"] == document["member_id"]
            ]
            if mine != [set(document["owned"])]:
                return False  # the describe is older than this member's own assignment
        seen.update(documents[0])
        return bool(rogue.assigned)

    wait_until(stable, f"two instances and the rogue at {rogue_url} share {PARTITIONS} partitions", SETTLE_S)
    return seen


def genuine_client_id(bootstrap: str, group: str, url: str) -> str:
    """What anyone allowed to describe the group reads: a genuine instance's client.id, proof included."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    return next(m.client_id for m in description.members if m.client_id.startswith(url + " "))


@pytest.mark.parametrize("identity", ["forged_url", "copied_proof"])
async def test_a_rogue_group_member_receives_no_request_and_callers_are_still_answered(
    kafka_bootstrap: str, fleet: LocalInstances, topic: str, identity: str
) -> None:
    forwarding = fleet.start({"PURGATORY_SCALEOUT__MODE": "forward"})
    redirecting = fleet.start({"PURGATORY_SCALEOUT__MODE": "redirect"})
    genuine = {forwarding.url, redirecting.url}
    group = f"g-{topic}"
    with RecordingServer() as rogue_server:
        if identity == "forged_url":
            client_id, rogue_url = rogue_server.url, rogue_server.url
        else:
            wait_until(
                lambda: len(fleet.owners(redirecting, BEARER)["members"]) == 2, "both joined", SETTLE_S
            )
            client_id, rogue_url = genuine_client_id(kafka_bootstrap, group, redirecting.url), redirecting.url
        with RogueMember(kafka_bootstrap, group, topic, client_id) as rogue:
            owners = settled_with_rogue(fleet, rogue, rogue_url)
            rogue_members = [m for m in owners["members"] if m["member_id"] == rogue.member_id]
            assert len(rogue_members) == 1 and rogue_members[0]["url"] == rogue_url
            if identity == "forged_url":
                assert rogue_members[0]["trusted"] is False, "no proof: not trusted"
            async with httpx.AsyncClient(timeout=20.0) as http:
                redirects = 0
                for instance in (forwarding, redirecting):
                    for partition in range(PARTITIONS):
                        redirects += await _asked_and_answered(
                            http, instance, topic, partition, genuine, rogue_server
                        )
                metrics = (await http.get(f"{forwarding.url}/metrics", headers=BEARER)).text
            assert not rogue_server.received, f"the rogue received requests: {rogue_server.received}"
            # The genuine instances still send each other what the other owns (2 partitions each).
            assert redirects >= 2, "the redirecting instance sent clients to the forwarding one"
            forwarded = re.search(
                r'purgatory_service_misdirected_requests_total\{answer="forward"\} (\S+)', metrics
            )
            assert forwarded and float(forwarded[1]) >= 2, metrics
            if identity == "forged_url":
                assert "purgatory_ownership_untrusted_members 1.0" in metrics, metrics
                # Logged once per instance, however many describes saw it.
                for instance in (forwarding, redirecting):
                    lines = [
                        json.loads(line)
                        for line in instance.log_path.read_text().splitlines()
                        if "ownership_member_untrusted" in line
                    ]
                    assert [line["member_id"] for line in lines] == [rogue.member_id], lines
            assert rogue.assigned, "the rogue held partitions throughout"


async def _asked_and_answered(
    http: httpx.AsyncClient,
    instance: Instance,
    topic: str,
    partition: int,
    genuine: set[str],
    rogue_server: RecordingServer,
) -> int:
    """Ask ``partition`` at ``instance`` with the caller's token; 1 if it took a 307, else 0."""
    path = f"/topics/{topic}/partitions/{partition}/records"
    answer = await http.get(f"{instance.url}{path}", params={"offset": 0, "max_wait_ms": 50}, headers=BEARER)
    redirected = answer.status_code == 307
    if redirected:
        location = answer.headers["location"]
        assert location.startswith(tuple(f"{url}{path}?" for url in genuine - {instance.url})), (
            f"a 307 only to the other genuine instance, got {location}"
        )
        assert not location.startswith(rogue_server.url)
        answer = await http.get(location, headers=BEARER)
    else:
        assert "location" not in answer.headers, answer.headers
    assert answer.status_code == 200, f"partition {partition} at {instance.url}: {answer.text}"
    body = answer.json()
    assert body.get("partition") == partition and "rogue" not in body, body
    return int(redirected)
