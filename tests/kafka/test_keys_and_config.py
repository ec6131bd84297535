"""Kafka keys and client configuration (no broker needed)."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import re
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
import structlog
from purgatory.adapters.kafka import (
    ClusterView,
    GroupPartitionKey,
    InvalidTopicError,
    KafkaConfigError,
    ProducerRecord,
    RecordSender,
    TopicKey,
    TopicPartitionKey,
    check_client_config,
    client_config,
    redacted,
)
from purgatory.adapters.kafka.settings import KafkaSettings
from pydantic import SecretStr

from purgatory._secrets import MASK as MASKED


def test_keys_are_frozen_hashable_and_labelled_like_kafka() -> None:
    key = TopicPartitionKey("orders", 3)
    assert key.label == str(key) == "orders-3"
    assert GroupPartitionKey("billing", "orders", 3).label == "billing/orders-3"
    assert TopicKey("orders").label == "orders"
    assert {key: 1}[TopicPartitionKey("orders", 3)] == 1, "equal keys hash alike"
    assert TopicPartitionKey("orders", 3) != TopicKey("orders")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.partition = 4  # type: ignore[misc]


@pytest.mark.parametrize("partition", [-1, 2**31, True, 1.0])
def test_a_partition_outside_kafkas_int32_is_refused_naming_it(partition: object) -> None:
    # 2**31 was accepted, then librdkafka's TopicPartition raised an OverflowError naming nothing.
    for make in (
        lambda: TopicPartitionKey("orders", partition),
        lambda: GroupPartitionKey("g", "orders", partition),
    ):
        with pytest.raises(ValueError, match="partition must be an int from 0 to 2147483647"):
            make()  # type: ignore[arg-type]


def test_a_partition_key_hashes_once_and_as_its_fields_do() -> None:
    """The hash is cached at construction (the feed hashes a key ~10 times per completion): it must
    stay the dataclass's own value, equal keys equal hashes, and survive pickling and replace()."""
    key = TopicPartitionKey("orders", 3)
    assert hash(key) == hash(("orders", 3)), "the cached hash is the generated __hash__'s value"
    assert {key: 1}[TopicPartitionKey("orders", 3)] == 1, "an equal key finds the entry"
    copied = pickle.loads(pickle.dumps(key))
    assert copied == key and hash(copied) == hash(key)
    moved = dataclasses.replace(key, partition=4)
    assert hash(moved) == hash(("orders", 4)) and moved != key
    assert repr(key) == "TopicPartitionKey(topic='orders', partition=3)", "the cache is not in the repr"
    # FrozenInstanceError on 3.12+; 3.11's frozen+slots __setattr__ raises TypeError for a name
    # that is not a field (its super() names the class before slots were added).
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):
        key._hash = 0  # type: ignore[misc]
    assert hash(key) == hash(("orders", 3)), "the cache cannot be overwritten"


def test_a_partition_key_is_its_two_values_to_dataclass_helpers() -> None:
    """Users treat a key as a plain (topic, partition) value: the hash cache is not a field."""
    key = TopicPartitionKey("orders", 3)
    assert [f.name for f in dataclasses.fields(key)] == ["topic", "partition"]
    assert dataclasses.asdict(key) == {"topic": "orders", "partition": 3}
    assert dataclasses.astuple(key) == ("orders", 3)
    assert TopicPartitionKey(**dataclasses.asdict(key)) == key, "asdict round-trips through the constructor"
    for copied in (copy.copy(key), copy.deepcopy(key)):
        assert copied == key and hash(copied) == hash(key) and {key: 1}[copied] == 1


def test_a_key_pickled_in_another_process_finds_equal_keys() -> None:
    """str hashes are salted per process: a key unpickled here must hash with this process's salt,
    not carry the hash computed where it was pickled (a dict lookup by an equal key would miss)."""
    script = (
        "import pickle, sys\n"
        "from purgatory.adapters.kafka import TopicPartitionKey\n"
        "sys.stdout.buffer.write(pickle.dumps(TopicPartitionKey('orders', 3)))\n"
    )
    foreign = {**os.environ, "PYTHONHASHSEED": "1"}
    if os.environ.get("PYTHONHASHSEED") == "1":
        foreign["PYTHONHASHSEED"] = "2"
    pickled = subprocess.run(
        [sys.executable, "-c", script], env=foreign, capture_output=True, check=True, timeout=60
    ).stdout
    key = pickle.loads(pickled)
    assert key == TopicPartitionKey("orders", 3)
    assert hash(key) == hash(("orders", 3)), "hashed with this process's salt"
    assert {TopicPartitionKey("orders", 3): 1}.get(key) == 1, "an equal key made here finds it"


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: TopicPartitionKey("", 0), "topic"),
        (lambda: TopicPartitionKey("t", -1), "partition"),
        (lambda: TopicPartitionKey("t", True), "partition"),
        (lambda: GroupPartitionKey("", "t", 0), "group"),
        (lambda: TopicKey(""), "topic"),
    ],
)
def test_bad_keys_are_refused_naming_the_field(build: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build()  # type: ignore[operator]


@pytest.mark.parametrize(
    "topic", ["..", ".", "a" * 250, "bad topic", "orders\n", "t\u00f3pico", "orders/1", "ord:ers"]
)
@pytest.mark.parametrize(
    "build",
    [
        lambda topic: TopicPartitionKey(topic, 0),
        lambda topic: TopicKey(topic),
        lambda topic: GroupPartitionKey("g", topic, 0),
        lambda topic: ProducerRecord(topic, b"v"),
    ],
)
def test_a_topic_name_kafka_refuses_is_refused_when_the_key_or_record_is_built(
    build: Callable[[str], object], topic: str
) -> None:
    # Before, the key was built and watched, and only Kafka's answer (a round trip later) said so.
    with pytest.raises(InvalidTopicError, match="not a legal Kafka topic name") as info:
        build(topic)
    assert repr(topic) in str(info.value)
    assert isinstance(info.value, ValueError), "still the ValueError a bad key always raised"


def test_every_legal_topic_name_makes_a_key() -> None:
    for topic in ("a", "A.b_c-9", "a" * 249, "__consumer_offsets", "..a", "..."):
        assert TopicPartitionKey(topic, 0).topic == topic


@pytest.mark.parametrize(
    ("fields", "error", "named"),
    [
        ({"topic": "orders", "value": "text"}, TypeError, "ProducerRecord.value"),
        ({"topic": "orders", "value": b"v", "key": 7}, TypeError, "ProducerRecord.key"),
        ({"topic": "", "value": b"v"}, ValueError, "topic"),
        ({"topic": "orders", "value": b"v", "partition": -1}, ValueError, "partition"),
        ({"topic": "orders", "value": b"v", "partition": True}, ValueError, "partition"),
        ({"topic": "orders", "value": b"v", "partition": 2**31}, ValueError, "partition"),
        ({"topic": "orders", "value": b"v", "headers": [("trace", "text")]}, TypeError, "headers"),
        ({"topic": "orders", "value": b"v", "headers": "trace"}, TypeError, "headers"),
    ],
)
def test_a_bad_producer_record_is_refused_when_built_naming_its_field(
    fields: dict[str, object], error: type[Exception], named: str
) -> None:
    # librdkafka would take a str as UTF-8, partition -1 as "any partition" and True as 1.
    with pytest.raises(error, match=re.escape(named)):
        ProducerRecord(**fields)  # type: ignore[arg-type]


def test_a_producer_record_keeps_its_headers_in_order_as_pairs() -> None:
    record = ProducerRecord("orders", b"v", headers=[("trace", b"1"), ("trace", None)])  # type: ignore[arg-type]
    assert record.headers == (("trace", b"1"), ("trace", None))
    assert hash(record) == hash(ProducerRecord("orders", b"v", headers=(("trace", b"1"), ("trace", None))))


def test_client_config_carries_security_and_passthrough_and_redacts_secrets() -> None:
    settings = KafkaSettings(
        bootstrap_servers="b:9092",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="svc",
        sasl_password=SecretStr("hunter2"),
        client_config={"client.id": "gateway"},
    )
    config = client_config(settings)
    assert config["sasl.password"] == "hunter2", "librdkafka gets the secret"
    assert config["client.id"] == "gateway" and config["security.protocol"] == "SASL_SSL"
    shown = redacted(config)
    assert "hunter2" not in repr(shown) and shown["sasl.username"] == "svc"
    assert "hunter2" not in repr(settings)


def test_the_cluster_view_never_logs_the_password() -> None:
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", sasl_password=SecretStr("hunter2"))
    with structlog.testing.capture_logs() as logs:
        ClusterView(settings).admin  # noqa: B018 — creating the client logs its (redacted) config
    assert logs, "the connection is logged"
    assert "hunter2" not in repr(logs)


def test_redacted_client_configs_mask_declared_secret_keys_by_value() -> None:
    custom = f"custom-{uuid.uuid4().hex}"
    kafka = KafkaSettings(
        bootstrap_servers="127.0.0.1:1",
        client_config={"vendor.thing": custom, "my.apikey": f"apikey-{uuid.uuid4().hex}"},
        secret_keys=("vendor.thing",),
    )
    shown = redacted(client_config(kafka))
    assert shown["vendor.thing"] == MASKED and shown["my.apikey"] == MASKED
    assert shown["bootstrap.servers"] == "127.0.0.1:1"
    assert client_config(kafka)["vendor.thing"] == custom, "the client itself still gets the value"


def test_the_produce_producer_is_idempotent_whatever_client_config_tunes() -> None:
    """acks=all with retries the broker de-duplicates, in order: what a produce relies on."""
    sender = RecordSender(KafkaSettings(bootstrap_servers="x:1", client_config={"socket.timeout.ms": "300"}))
    config = sender._config
    assert config["enable.idempotence"] is True
    assert config["socket.timeout.ms"] == "300", "other passthrough properties still apply"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("retries", "0"),
        ("message.send.max.retries", "0"),
        ("acks", "1"),
        ("request.required.acks", "1"),
        ("enable.idempotence", "false"),
        ("max.in.flight", "1"),
    ],
)
def test_client_config_weakening_the_produce_is_refused_naming_the_key(name: str, value: str) -> None:
    settings = KafkaSettings(bootstrap_servers="x:1", client_config={name: value})
    with pytest.raises(KafkaConfigError, match=rf"kafka\.client_config\['{re.escape(name)}'\]: the produce"):
        check_client_config(settings)
