"""Crafted requests, as an attacker would send them, against the service on uvicorn and real Kafka.

Every row of :data:`CASES` is one crafted request and the answer it must get: a 4xx (or 503)
with a JSON error naming the field at fault. After it, a good request on the *same pooled
connection* must succeed: a 500 from uvicorn (or a connection closed after a half-sent answer)
would fail it. And no row may reach the service's catch-all (``app.state.unexpected_errors``).

The rows stand for classes of input (issue 17): Unicode digits, non-finite numbers, unencodable
strings, nesting depth, huge/negative/boolean numbers, size limits, illegal and internal topic
names, wrong content types, and Kafka's own refusals surfacing from the adapter (an invalid
topic name, a record over the topic's ``max.message.bytes``, an offset past the end).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from purgatory.adapters.kafka import (
    ClusterView,
    InvalidTopicError,
    KafkaConfigError,
    ProducerRecord,
    TopicKey,
)
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.app._requests import MAX_PRODUCE_BODY_BYTES
from purgatory.adapters.service.server._server import BackgroundServer

from purgatory.settings import Settings
from tests.kafka.kafka_fixtures import RecordAppender, create_topic

from .conftest import Service

JSON = {"content-type": "application/json"}
P0 = "records[0].partition"
DEEP = 100_000  # nesting levels of the deep-JSON rows (the figure)
FAR = str(10**12)  # an offset far past the end of any test topic
RECORD_1_5_MB = 1_500_000  # under the 4 MiB body limit, over librdkafka's 1,000,000 message.max.bytes
SMALL_TOPIC_MAX_MESSAGE_BYTES = 1024  # the broker refuses what the producer lets through
BROKER_TOO_LARGE = 5000


@dataclass(frozen=True)
class Case:
    """One crafted request: ``{topic}``/``{small}`` in the path are the test topics."""

    name: str
    method: str
    path: str
    status: int
    field: str
    params: dict[str, str] | list[tuple[str, str]] = field(default_factory=dict)
    content: bytes | None = None
    headers: dict[str, str | bytes] = field(default_factory=lambda: dict(JSON))


def _get(name: str, partition: str, field: str, status: int = 400, **params: str) -> Case:
    return Case(name, "GET", f"/topics/{{topic}}/partitions/{partition}/records", status, field, params)


def _query(name: str, field: str, value: str, status: int = 400, **extra: str) -> Case:
    return _get(name, "0", field, status, **{field: value, **extra})


def _post(name: str, body: bytes | str, field: str, status: int = 400, *, topic: str = "{topic}") -> Case:
    content = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    return Case(name, "POST", f"/topics/{topic}/records", status, field, content=content)


def _replicated(name: str, field: str, **params: str) -> Case:
    return Case(name, "GET", "/topics/{topic}/replicated", 400, field, {"offsets": "0:0", **params})


def _records(record: str, extra: str = "") -> str:
    """A produce body (raw JSON text: NaN, lone surrogates and the like survive as written)."""
    return '{"records": [' + record + "]" + extra + "}"


def _content_type(name: str, content_type: str | bytes | None) -> Case:
    headers: dict[str, str | bytes] = {} if content_type is None else {"content-type": content_type}
    body = _records('{"value": "a"}').encode()
    return Case(name, "POST", "/topics/{topic}/records", 415, "content-type", content=body, headers=headers)


def _topic(name: str, topic: str, status: int = 400) -> list[Case]:
    return [
        Case(f"GET {name}", "GET", f"/topics/{topic}/partitions/0/records", status, "topic"),
        _post(f"POST {name}", _records('{"value": "a"}'), "topic", status, topic=topic),
    ]


# fmt: off
CASES: list[Case] = [
    # -- Unicode digits and other non-ASCII numbers in the path and query -----------------------
    _get("partition superscript two", "²", "partition"),
    _get("partition Arabic-Indic three", "٣", "partition"),
    _get("partition fullwidth three", "３", "partition"),  # noqa: RUF001
    _get("partition negative", "-1", "partition"),
    _get("partition past int32", "2147483648", "partition"),
    _get("partition of 5000 digits", "1" * 5000, "partition"),
    _get("partition hexadecimal", "0x1", "partition"),
    _query("offset Arabic-Indic three", "offset", "٣"),
    _query("offset fullwidth three", "offset", "３"),  # noqa: RUF001
    _query("offset superscript two", "offset", "²"),
    # -- huge, negative, boolean and non-finite numbers in the query ----------------------------
    _query("offset negative", "offset", "-1"),
    _query("offset past int64", "offset", str(2**63)),
    _query("offset of 5000 digits", "offset", "9" * 5000),
    _query("offset NaN", "offset", "NaN"),
    _query("offset boolean", "offset", "true"),
    _query("max_wait_ms Infinity", "max_wait_ms", "Infinity"),
    _query("max_wait_ms negative", "max_wait_ms", "-1"),
    _query("max_bytes in exponent notation", "max_bytes", "1e3"),
    _query("min_records boolean", "min_records", "false"),
    _query("unknown parameter", "wait", "5"),
    Case("offset given twice", "GET", "/topics/{topic}/partitions/0/records", 400, "offset",
         [("offset", "0"), ("offset", "1")]),
    # -- the replicated wait's own query (partition:number lists, timeout_ms) -------------------
    _replicated("replicated offset past int64", "offsets", offsets=f"0:{2**63}"),
    _replicated("replicated offset Arabic-Indic three", "offsets", offsets="0:٣"),
    _replicated("replicated partition superscript two", "offsets", offsets="²:0"),
    _replicated("replicated partition past int32", "offsets", offsets=f"{2**31}:0"),
    _replicated("replicated partition named twice", "offsets", offsets="0:1,0:2"),
    _replicated("replicated epoch superscript two", "epochs", epochs="0:²"),
    _replicated("replicated epoch past int32", "epochs", epochs=f"0:{2**31}"),
    _replicated("replicated record identity timestamp past int64", "records", epochs="0:0",
                records=f"0:0:{2**63}:{'0' * 32}"),
    _replicated("replicated timeout_ms superscript two", "timeout_ms", timeout_ms="²"),
    _replicated("replicated timeout_ms of 27 hours", "timeout_ms", timeout_ms="99999999"),
    _replicated("replicated timeout_ms of 26 digits", "timeout_ms", timeout_ms="9" * 26),
    _replicated("replicated unknown parameter", "timeout", timeout="5"),
    # -- offset past the end: 416 whatever the wait (the range check must not depend on it) -----
    *[
        _query(f"offset past the end, max_wait_ms {w}", "offset", FAR, 416, max_wait_ms=str(w))
        for w in (0, 1, 10, 100, 1000)
    ],
    _query("offset int64 max, max_wait_ms 0", "offset", str(2**63 - 1), 416, max_wait_ms="0"),
    # -- illegal and internal topic names, on GET and POST --------------------------------------
    *_topic("topic %2e%2e", "%2e%2e"),
    *_topic("topic %2e", "%2e"),
    *_topic("topic of 250 characters", "a" * 250),
    *_topic("topic with a space", "bad%20topic"),
    *_topic("topic with a non-ASCII letter", "t%C3%B3pico"),
    *_topic("topic with a trailing newline (re.match's $ took it)", "orders%0A"),
    *_topic("topic with a lone surrogate, percent-encoded", "%ED%A0%80"),
    *_topic("internal topic __consumer_offsets", "__consumer_offsets", 403),
    *_topic("internal topic _confluent-metrics", "_confluent-metrics", 403),
    # -- non-finite numbers in the body (the error must not echo a non-JSON float) --------------
    _post("timeout_ms NaN", _records('{"value": "a"}', ', "timeout_ms": NaN'), "timeout_ms"),
    _post("timeout_ms Infinity", _records('{"value": "a"}', ', "timeout_ms": Infinity'), "timeout_ms"),
    _post("timeout_ms -Infinity", _records('{"value": "a"}', ', "timeout_ms": -Infinity'), "timeout_ms"),
    _post("timeout_ms 1e400 (infinite)", _records('{"value": "a"}', ', "timeout_ms": 1e400'), "timeout_ms"),
    _post("partition NaN", _records('{"value": "a", "partition": NaN}'), P0),
    # -- huge, negative, boolean, fractional and string numbers in the body ---------------------
    _post("timeout_ms 10**30", _records('{"value": "a"}', f', "timeout_ms": {10**30}'), "timeout_ms"),
    _post("timeout_ms of 5000 digits", _records('{"value": "a"}', f', "timeout_ms": {"9" * 5000}'), "body"),
    _post("timeout_ms boolean", _records('{"value": "a"}', ', "timeout_ms": true'), "timeout_ms"),
    _post("timeout_ms negative", _records('{"value": "a"}', ', "timeout_ms": -5'), "timeout_ms"),
    _post("partition boolean", _records('{"value": "a", "partition": true}'), P0),
    _post("partition fraction-free float", _records('{"value": "a", "partition": 0.0}'), P0),
    _post("partition as a string", _records('{"value": "a", "partition": "0"}'), P0),
    _post("partition negative", _records('{"value": "a", "partition": -1}'), P0),
    _post("partition past int32", _records(f'{{"value": "a", "partition": {2**31}}}'), P0),
    _post("partition that does not exist", _records('{"value": "a", "partition": 7}'), P0, 404),
    # -- strings with no UTF-8 encoding ---------------------------------------------------------
    _post("value lone high surrogate", _records('{"value": "\\ud800"}'), "records[0].value"),
    _post("key lone low surrogate", _records('{"value": "a", "key": "\\udfff"}'), "records[0].key"),
    _post("value surrogate mid-text", _records('{"value": "ok\\ud83dthen"}'), "records[0].value"),
    _post("lone surrogate as a member name", _records('{"value": "a"}', ', "\\ud800": 1'), "body"),
    _post(
        "headers (unsupported) with a surrogate",
        _records('{"value": "a", "headers": {"h": "\\ud800"}}'),
        "records[0].headers",
    ),
    _post("body not UTF-8", b'{"records": [{"value": "\xff\xfe"}]}', "body"),
    # -- nesting depth --------------------------------------------------------------------------
    _post("100,000-deep arrays", "[" * DEEP + "]" * DEEP, "body"),
    _post("100,000-deep objects", '{"a":' * DEEP + "1" + "}" * DEEP, "body"),
    _post("100,000-deep records", '{"records": ' + "[" * DEEP + "]" * DEEP + "}", "body"),
    # -- sizes ----------------------------------------------------------------------------------
    _post("1.5 MB value", json.dumps({"records": [{"value": "v" * RECORD_1_5_MB}]}), "records[0].value", 413),
    _post(
        "1.5 MB key", json.dumps({"records": [{"value": "v", "key": "k" * RECORD_1_5_MB}]}), "records[0].key",
        413,
    ),
    _post(
        "record over the topic's max.message.bytes (the broker refuses it)",
        json.dumps({"records": [{"value": "v" * BROKER_TOO_LARGE}]}),
        "records",
        413,
        topic="{small}",
    ),
    _post("body over 4 MiB", b"[" + b" " * (MAX_PRODUCE_BODY_BYTES + 1) + b"]", "body", 413),
    # -- not a produce request ------------------------------------------------------------------
    _post("empty body", b"", "body"),
    _post("JSON null", b"null", "body"),
    _post("JSON array", b"[]", "body"),
    _post("no records", b'{"records": []}', "records"),
    # -- wrong content types --------------------------------------------------------------------
    _content_type("no content-type", None),
    _content_type("text/plain", "text/plain"),
    _content_type("form", "application/x-www-form-urlencoded"),
    _content_type("multipart", "multipart/form-data; boundary=x"),
    _content_type("json-patch", "application/json-patch+json"),
    _content_type("non-ASCII content-type", b"application/json\xff"),
]
# fmt: on


@pytest.fixture(scope="module")
def topics(service: Service, kafka_bootstrap: str) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:10]
    topic = create_topic(kafka_bootstrap, f"crafted-{suffix}")
    small = create_topic(
        kafka_bootstrap,
        f"crafted-small-{suffix}",
        config={"max.message.bytes": str(SMALL_TOPIC_MAX_MESSAGE_BYTES)},
    )
    producer = RecordAppender(service.settings.kafka)
    try:
        producer.produce([ProducerRecord(topic, b"first"), ProducerRecord(topic, b"second")])
    finally:
        producer.close()
    return {"topic": topic, "small": small}


def _local_address(response: httpx.Response) -> Any:
    """The client side (address, port) of the connection that carried ``response``."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def _pooled_client(url: str) -> httpx.AsyncClient:
    # One connection in the pool: the request after a crafted one must reuse it.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_crafted_request_gets_a_json_4xx_naming_the_field_and_the_connection_stays_usable(
    service: Service, topics: dict[str, str], case: Case
) -> None:
    unexpected_before = service.app.state.unexpected_errors.count
    path = case.path.format(**topics)
    async with _pooled_client(service.url) as client:
        response = await client.request(
            case.method, path, params=case.params, content=case.content, headers=case.headers
        )
        assert response.status_code == case.status, response.text[:500]
        assert response.headers["content-type"] == "application/json", response.text[:500]
        error = response.json()
        assert error["field"] == case.field, error
        assert error["error"] and error["message"], error
        assert "connection" not in response.headers, "a refusal must not end the connection"

        good = await client.get(
            f"/topics/{topics['topic']}/partitions/0/records", params={"offset": 0, "max_wait_ms": 10_000}
        )
        assert good.status_code == 200, good.text
        assert [r["value"] for r in good.json()["records"]] == ["first", "second"]
        assert _local_address(good) == _local_address(response), "the next request reused the connection"
    assert service.app.state.unexpected_errors.count == unexpected_before, "reached the catch-all (a 500)"


def test_the_table_covers_every_class_of_crafted_input() -> None:
    assert len(CASES) >= 80, len(CASES)
    statuses = {c.status for c in CASES}
    assert statuses == {400, 403, 404, 413, 415, 416}, statuses
    assert all(400 <= c.status < 500 for c in CASES)


# -- Kafka's refusals, typed by the adapter (the table's topic check stops them before Kafka) ----


def test_kafka_refusing_a_topic_name_is_a_typed_invalid_topic_error(kafka_settings: KafkaSettings) -> None:
    # The key refuses the name itself now (Kafka's rule, adapters/kafka/facts/_keys.py): the same typed
    # error, before a round trip.
    view = ClusterView(kafka_settings)
    try:
        with pytest.raises(InvalidTopicError, match="topic name"):
            view.topics([TopicKey("..")])
    finally:
        view.close()


# -- wrong SASL/JAAS settings: a clear error at start, or 503; never a 500 -----------------------


@pytest.mark.parametrize(
    ("client", "named"),
    [
        ({"sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required;"}, "jaas"),
        ({"no.such.property": "1"}, "no.such.property"),
    ],
)  # fmt: skip
def test_a_client_property_librdkafka_refuses_fails_at_start_naming_it(
    kafka_bootstrap: str, client: dict[str, str], named: str
) -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, client_config=client))
    with pytest.raises(KafkaConfigError, match=named):
        create_app(settings)


def test_an_unsupported_sasl_mechanism_fails_at_start_naming_it(kafka_bootstrap: str) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=kafka_bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="BOGUS",
        sasl_username="svc",
        sasl_password="pw-not-shown-anywhere",
    )
    with pytest.raises(KafkaConfigError, match="BOGUS") as info:
        create_app(Settings(kafka=kafka))
    assert "pw-not-shown-anywhere" not in str(info.value)


async def test_sasl_credentials_against_a_plaintext_broker_answer_503_not_500(kafka_bootstrap: str) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=kafka_bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="svc",
        sasl_password="wrong-password",
        request_timeout_ms=1000,
    )
    app = create_app(Settings(kafka=kafka))
    with BackgroundServer(app) as server:
        async with _pooled_client(server.url) as client:
            answers = [
                await client.get("/topics/any-topic/partitions/0/records", params={"max_wait_ms": 0}),
                await client.post("/topics/any-topic/records", json={"records": [{"value": "a"}]}),
            ]
            health = await client.get("/healthz")
            assert _local_address(answers[0]) == _local_address(answers[1]) == _local_address(health)
    for response in answers:
        assert response.status_code == 503, response.text
        assert response.json()["error"] == "KAFKA_UNAVAILABLE"
    assert health.status_code == 200
    assert app.state.unexpected_errors.count == 0
