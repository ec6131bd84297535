"""The gateway is the HTTP side of one KafkaPurgatory: it wires no Kafka client of its own.

No Kafka needed: clients connect lazily and nothing here waits on the cluster.
"""

from __future__ import annotations

import pytest
from purgatory.adapters.kafka import (
    DelayedFetch,
    DelayedProduce,
    DelayedReplication,
    KafkaPurgatory,
    SharedReadReader,
    provide_cluster,
)
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import FETCH_PURGATORY, PRODUCE_PURGATORY, Gateway, resolve_bootstrap
from purgatory.adapters.service.settings import AdmissionSettings

from purgatory import PurgatoryClosedError
from purgatory.settings import Settings

NOBODY = "127.0.0.1:9"  # the discard port: nothing answers, and nothing here asks


def test_a_gateway_shares_its_kafka_purgatorys_view_feed_clients_and_purgatories() -> None:
    settings = Settings(
        kafka=KafkaSettings(bootstrap_servers=NOBODY), admission=AdmissionSettings(max_waiters_per_key=7)
    )
    gateway = Gateway(settings)
    kp = gateway.kafka
    try:
        assert isinstance(kp, KafkaPurgatory)
        assert gateway.view is kp.view and kp.feed.view is kp.view, "one cluster view"
        assert gateway.feed is kp.feed, "one change feed"
        assert gateway.sender is kp.sender, "one producer"
        assert gateway.reader is kp.reader and isinstance(kp.reader, SharedReadReader), "one shared reader"
        assert gateway.journal is kp.journal
        assert kp.purgatories == {
            FETCH_PURGATORY: gateway.fetch_purgatory,
            PRODUCE_PURGATORY: gateway.produce_purgatory,
            "replication": gateway.replication_purgatory,
        }, "the gateway's purgatories are the KafkaPurgatory's, and only those"
        assert kp.purgatory_for_kind(DelayedFetch) is gateway.fetch_purgatory
        assert kp.purgatory_for_kind(DelayedProduce) is gateway.produce_purgatory
        assert kp.purgatory_for_kind(DelayedReplication) is gateway.replication_purgatory
        assert [p.max_pending_per_key for p in gateway.purgatories] == [7, 7, 7], "admission applies to them"
    finally:
        gateway.close()
    with pytest.raises(PurgatoryClosedError):
        kp.purgatory  # noqa: B018  closing the gateway closed its KafkaPurgatory


def test_the_gateway_and_the_kafka_provider_pick_the_same_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers="from-settings:9092"))
    for env in (None, "from-env:9092"):
        if env is None:
            monkeypatch.delenv("PURGATORY_KAFKA_BOOTSTRAP", raising=False)
        else:
            monkeypatch.setenv("PURGATORY_KAFKA_BOOTSTRAP", env)
        existing = provide_cluster(settings.kafka)  # an existing cluster: nothing is started
        assert existing.provider == "existing"
        assert existing.bootstrap_servers == resolve_bootstrap(settings) == (env or "from-settings:9092")
