"""``GET /topics/{t}/replicated`` with leader epochs and record identities.

A caller that knows where its records were appended (offsets, the leader epoch, what the first
and last record are) waits for their replication without being told "replicated" for a record a
leader change discarded; a wait that moves to another instance carries both fences along. The
query is built by the same function the MOVED answer uses.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

import pytest
from purgatory.adapters.kafka import (
    Appended,
    DelayedReplication,
    ProducerRecord,
    RecordIdentity,
    TopicPartitionKey,
)
from purgatory.adapters.service.scaleout._scaleout import replicated_query

from tests.kafka.kafka_fixtures import TopicFactory

from .conftest import Service

pytestmark = pytest.mark.kafka


async def _moved_query(service: Service, topic: str, count: int = 1) -> dict[str, str]:
    gateway = service.gateway
    records = [ProducerRecord(topic, b"mine-%d" % i, b"k", 0) for i in range(count)]
    produced = await gateway.kafka.produce_async(records)
    assert produced.succeeded, produced.record_statuses
    key = TopicPartitionKey(topic, 0)
    epochs = await asyncio.to_thread(gateway.view.leader_epochs, [key])
    offsets = produced.result().offsets
    ends = {0: records[0], len(records) - 1: records[-1]}
    identities = tuple(RecordIdentity.of(offsets[i] or 0, r.key, r.value, -1) for i, r in ends.items())
    appended = Appended({key: offsets[-1] or 0}, epochs, {key: identities}, gateway.reader)
    query = replicated_query(DelayedReplication(gateway.feed, appended), 15_000)
    assert query is not None, "every partition's epoch was known before the append"
    return query


@pytest.mark.parametrize("count", [1, 3])
async def test_a_wait_with_epochs_and_records_is_answered_replicated(
    service: Service, kafka_topic_factory: TopicFactory, count: int
) -> None:
    topic = kafka_topic_factory(1)
    query = await _moved_query(service, topic, count)
    assert set(query) == {"offsets", "epochs", "records", "timeout_ms"}, query
    assert len(query["records"].split(",")) == min(count, 2), "the first and the last record"
    async with service.client() as client:
        answer = await client.get(f"/topics/{topic}/replicated?{urlencode(query)}")
    assert answer.status_code == 200, answer.text
    assert answer.json()["statuses"] == {"0": "NONE"}


async def test_a_wait_whose_offset_holds_another_record_is_503_not_leader(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    query = await _moved_query(service, topic)
    partition, offset, timestamp, _digest = query["records"].split(":")
    other = RecordIdentity.of(int(offset), b"k", b"mine-1", int(timestamp))  # what a deposed leader leaves
    query["records"] = f"{partition}:{offset}:{timestamp}:{other.digest.hex()}"
    async with service.client() as client:
        answer = await client.get(f"/topics/{topic}/replicated?{urlencode(query)}")
    assert answer.status_code == 503, answer.text
    assert answer.json()["statuses"] == {"0": "NOT_LEADER_OR_FOLLOWER"}


@pytest.mark.parametrize(
    "records",
    [
        "0:0:12:abc",
        "0:0:x:" + "00" * 16,
        "0:0:-2:" + "00" * 16,
        "0:x:12:" + "00" * 16,
        "0:0:12",
        "1:0:12:" + "00" * 16,
        "0:0:1:2:" + "00" * 16,
    ],
)
async def test_malformed_record_identities_are_400_naming_the_field(
    service: Service, kafka_topic_factory: TopicFactory, records: str
) -> None:
    topic = kafka_topic_factory(1)
    query = {"offsets": "0:0", "epochs": "0:0", "records": records}
    async with service.client() as client:
        answer = await client.get(f"/topics/{topic}/replicated?{urlencode(query)}")
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == "records"


async def test_a_wait_for_an_offset_not_yet_in_the_log_times_out_without_claiming_an_append(
    service: Service, kafka_topic_factory: TopicFactory
) -> None:
    # The client names an offset nobody appended (yet): 504, and the message must not say the
    # leader appended records — the route produced nothing (a produce's 504 does say so).
    topic = kafka_topic_factory(1)
    async with service.client() as client:
        answer = await client.get(f"/topics/{topic}/replicated?offsets=0:5&timeout_ms=300")
    assert answer.status_code == 504, answer.text
    body = answer.json()
    assert body["error"] == "REQUEST_TIMED_OUT" and body["statuses"] == {"0": "REQUEST_TIMED_OUT"}, body
    assert "appended by the leader" not in body["message"], body["message"]
    assert "not yet in the log" in body["message"], body["message"]
