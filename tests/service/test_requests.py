"""Request models of the service: limits and the field each refusal names (no Kafka needed)."""

from __future__ import annotations

import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import FetchParams, Gateway, ProduceRequest, resolve_bootstrap
from purgatory.adapters.service.answers._errors import from_validation_error
from purgatory.adapters.service.app._requests import (
    MAX_FETCH_BYTES,
    MAX_RECORDS_PER_PRODUCE,
    MAX_WAIT_MS_LIMIT,
)
from pydantic import ValidationError

from purgatory.settings import ConfigError, Settings


def _refusal(model: type[FetchParams] | type[ProduceRequest], data: object) -> tuple[int, str | None, str]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    error = from_validation_error(info.value, where="query")
    return error.status, error.field, error.message


def test_query_strings_are_parsed_as_ints() -> None:
    params = FetchParams.model_validate({"offset": "5", "max_wait_ms": "250", "max_bytes": "1024"})
    assert (params.offset, params.max_wait_ms, params.max_bytes, params.min_bytes) == (5, 250, 1024, None)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"max_wait_ms": "-1"}, "max_wait_ms"),
        ({"max_wait_ms": str(MAX_WAIT_MS_LIMIT + 1)}, "max_wait_ms"),
        ({"max_bytes": str(MAX_FETCH_BYTES + 1)}, "max_bytes"),
        ({"max_bytes": "0"}, "max_bytes"),
        ({"offset": "-3"}, "offset"),
        ({"offset": "abc"}, "offset"),
        ({"min_bytes": "2048", "max_bytes": "1024"}, "min_bytes"),
        ({"max_wait": "100"}, "max_wait"),
    ],
)
def test_bad_fetch_parameters_are_refused_naming_the_field(query: dict[str, str], field: str) -> None:
    status, named, message = _refusal(FetchParams, query)
    assert status == 400
    assert named == field
    assert field in message


def test_produce_body_refusals_name_the_nested_field() -> None:
    assert _refusal(ProduceRequest, {"records": []})[1] == "records"
    assert (
        _refusal(ProduceRequest, {"records": [{"value": "a", "partition": -1}]})[1] == "records[0].partition"
    )
    assert _refusal(ProduceRequest, {"records": [{"value": 1}]})[1] == "records[0].value"
    assert _refusal(ProduceRequest, {"records": [{"value": "a"}], "timeout_ms": 0})[1] == "timeout_ms"
    too_many = {"records": [{"value": "a"}] * (MAX_RECORDS_PER_PRODUCE + 1)}
    assert _refusal(ProduceRequest, too_many)[1] == "records"


def test_long_values_are_not_echoed_back() -> None:
    with pytest.raises(ValidationError) as info:
        FetchParams.model_validate({"offset": "x" * 1000})
    error = from_validation_error(info.value, where="query")
    assert error.value is None and "x" * 100 not in error.message


def test_the_service_refuses_to_start_without_a_kafka_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PURGATORY_KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(ConfigError, match="PURGATORY_KAFKA__BOOTSTRAP_SERVERS"):
        Gateway(Settings())


def test_bootstrap_order_matches_the_kafka_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers="from-settings:9092"))
    monkeypatch.delenv("PURGATORY_KAFKA_BOOTSTRAP", raising=False)
    assert resolve_bootstrap(settings) == "from-settings:9092"
    monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", "from-env:9092")
    assert resolve_bootstrap(settings) == "from-env:9092"
    assert resolve_bootstrap(settings, "explicit:9092") == "explicit:9092"
