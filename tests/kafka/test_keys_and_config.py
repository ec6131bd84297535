"""Kafka keys and client configuration (no broker needed)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
import structlog
from purgatory.adapters.kafka import (
    ClusterView,
    GroupPartitionKey,
    TopicKey,
    TopicPartitionKey,
    client_config,
    redacted,
)
from pydantic import SecretStr

from purgatory._secrets import MASK as MASKED
from purgatory.settings import KafkaSettings


def test_keys_are_frozen_hashable_and_labelled_like_kafka() -> None:
    key = TopicPartitionKey("orders", 3)
    assert key.label == str(key) == "orders-3"
    assert GroupPartitionKey("billing", "orders", 3).label == "billing/orders-3"
    assert TopicKey("orders").label == "orders"
    assert {key: 1}[TopicPartitionKey("orders", 3)] == 1, "equal keys hash alike"
    assert TopicPartitionKey("orders", 3) != TopicKey("orders")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.partition = 4  # type: ignore[misc]


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
