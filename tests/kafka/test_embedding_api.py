"""The embedding API's public face: documented result dataclasses and attributes (issue 13)."""

from __future__ import annotations

import dataclasses
import json
import pydoc

import pytest
from purgatory.adapters.kafka import (
    PURGATORY_NAMES,
    AsyncKafkaPurgatory,
    CommitResult,
    DelayedConsumerCommit,
    DelayedDeleteRecords,
    DelayedFetch,
    DelayedProduce,
    DelayedTopicReady,
    DeleteRecordsResult,
    ErrorCode,
    FetchResult,
    KafkaPurgatory,
    ProduceResult,
    TopicPartitionKey,
    TopicReadyResult,
)
from purgatory.adapters.kafka.settings import KafkaSettings

from purgatory import DelayedOperationPurgatory, Outcome
from purgatory.testing import MockTimer

RESULTS = (ProduceResult, FetchResult, CommitResult, TopicReadyResult, DeleteRecordsResult)


class NoFacts:
    """A FactSource that has seen nothing yet (the feed before its first poll)."""

    settings = KafkaSettings()
    unavailable = None

    def partition(self, key: object) -> None:
        return None

    def topic(self, key: object) -> None:
        return None

    def group(self, key: object) -> None:
        return None


@pytest.mark.parametrize("result_type", RESULTS, ids=lambda t: t.__name__)
def test_result_types_are_frozen_dataclasses_documenting_every_field(result_type: type) -> None:
    assert dataclasses.is_dataclass(result_type)
    doc = result_type.__doc__ or ""
    for field in dataclasses.fields(result_type):
        assert f"{field.name}:" in doc, f"{result_type.__name__} does not document {field.name}"
    assert "succeeded:" in doc and isinstance(result_type.succeeded, property)
    assert result_type.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_help_shows_the_public_attributes_of_kafka_purgatory() -> None:
    text = pydoc.render_doc(KafkaPurgatory, renderer=pydoc.plaintext)
    for attribute in ("feed:", "view:", "sender:", "reader:", "purgatory:", "purgatories:", "aio:"):
        assert attribute in text, f"help(KafkaPurgatory) does not explain {attribute}"
    for method in ("wait_committed", "wait_topic_ready", "delete_records", "create_topic", "aclose"):
        assert method in pydoc.render_doc(AsyncKafkaPurgatory, renderer=pydoc.plaintext)


def test_each_operation_kind_has_its_own_purgatory_name() -> None:
    names = [PURGATORY_NAMES[kind] for kind in (DelayedProduce, DelayedFetch, DelayedConsumerCommit)]
    names += [PURGATORY_NAMES[kind] for kind in (DelayedTopicReady, DelayedDeleteRecords)]
    assert names == ["produce", "fetch", "commit", "topic_ready", "delete_records"]


def test_result_before_the_operation_finished_is_refused() -> None:
    op = DelayedTopicReady(NoFacts(), "orders", delay_ms=1000)
    with pytest.raises(RuntimeError, match="has not finished"):
        op.result()


def test_an_expired_commit_barrier_answers_a_timed_out_commit_result() -> None:
    timer = MockTimer()
    purgatory = DelayedOperationPurgatory[DelayedConsumerCommit]("commit", timer=timer, reaper_enabled=False)
    key = TopicPartitionKey("orders", 0)
    op = DelayedConsumerCommit(NoFacts(), "billing", {key: 5}, delay_ms=100)
    try:
        purgatory.try_complete_else_watch(op, op.watch_keys())
        timer.advance_clock(100)
        result = op.result()
    finally:
        purgatory.shutdown()
    assert result == CommitResult(
        Outcome.EXPIRED, "billing", {key: 5}, {key: None}, {key: ErrorCode.REQUEST_TIMED_OUT}
    )
    assert not result.succeeded
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.group = "other"  # type: ignore[misc]


def test_connect_applies_log_format_json_from_the_settings() -> None:
    """Embedded, ``log.format = "json"`` holds without a configure_logging call of the user's."""
    import structlog

    from purgatory.settings import LogSettings, Settings

    previous = structlog.get_config()
    structlog.reset_defaults()
    settings = Settings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"), log=LogSettings(level="WARNING", format="json")
    )
    try:
        KafkaPurgatory.connect(settings, metrics=False).close()  # no Kafka request: clients are lazy
        processors = structlog.get_config()["processors"]
        # The renderer may be wrapped (secret values are masked on the rendered line): what
        # counts is that the final line is JSON.
        line = processors[-1](None, "warning", {"event": "probe", "n": 1})
        assert json.loads(line) == {"event": "probe", "n": 1}
    finally:
        structlog.configure(**previous)


def test_connect_leaves_logging_its_host_configured_alone() -> None:
    import structlog

    from purgatory.settings import LogSettings, Settings

    previous = structlog.get_config()
    mine = [structlog.processors.KeyValueRenderer()]
    structlog.configure(processors=mine)
    try:
        settings = Settings(
            kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"), log=LogSettings(format="json")
        )
        KafkaPurgatory.connect(settings, metrics=False).close()
        assert structlog.get_config()["processors"] == mine
    finally:
        structlog.configure(**previous)


def test_connect_without_a_cluster_says_which_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from purgatory.settings import ConfigError

    for name in ("PURGATORY_KAFKA_BOOTSTRAP", "PURGATORY_KAFKA__BOOTSTRAP_SERVERS", "PURGATORY_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="PURGATORY_KAFKA_BOOTSTRAP"):
        KafkaPurgatory.connect(metrics=False)


@pytest.mark.parametrize("drain", [True, False])
async def test_stop_shuts_the_purgatories_down_and_leaves_the_clients_to_close(drain: bool) -> None:
    """What an owner with workers of its own relies on (the HTTP gateway's fetch attempts): after
    ``stop()`` the operations are drained (or left, as Kafka does) while the clients still serve;
    ``close()`` then closes them."""
    from purgatory.adapters.kafka import KafkaUnavailableError

    kp = KafkaPurgatory.connect(KafkaSettings(bootstrap_servers="127.0.0.1:9"), metrics=False)
    try:
        op = DelayedTopicReady(NoFacts(), "orders", delay_ms=60_000)
        # Watched on a key the feed does not poll: nothing here waits on the (absent) cluster.
        kp.purgatory_for_kind(DelayedTopicReady).try_complete_else_watch(op, ["not-a-kafka-key"])
        kp.stop(drain=drain)
        assert op.outcome is (Outcome.EXPIRED if drain else None), "drained, or left unexecuted"
        probe = await kp.calls.run(lambda: "served", timeout_s=5.0, what="probe")
        assert probe == "served", "the clients stay open between stop() and close()"
    finally:
        kp.close()
    with pytest.raises(KafkaUnavailableError, match="closed"):
        await kp.calls.run(lambda: "served", timeout_s=5.0, what="probe")


@pytest.mark.parametrize("result_type", RESULTS, ids=lambda t: t.__name__)
def test_help_of_each_result_documents_shutdown_and_outage_answers(result_type: type) -> None:
    text = pydoc.render_doc(result_type)
    for name in ("shutting_down", "unavailable", "SHUTTING_DOWN"):
        assert name in text, f"help({result_type.__name__}) explains {name}"
    assert isinstance(result_type.shutting_down, property) and isinstance(result_type.unavailable, property)


def test_help_of_commit_result_says_when_the_group_has_no_committed_offset() -> None:
    text = pydoc.render_doc(CommitResult)
    assert "uncommitted" in text and "nothing_committed" in text and "UNKNOWN_TOPIC_OR_PARTITION" in text
