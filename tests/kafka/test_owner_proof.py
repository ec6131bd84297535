"""Scale-out owners prove they are instances: OwnerProof, and what an unproven member's partitions get.

A member of the ownership group names its own URL (``client.id``); only a member whose proof
verifies (HMAC of its URL with ``scaleout.secret``, and/or a URL in ``scaleout.trusted_urls``) is
sent clients or requests. Unit tests: no Kafka (the rogue consumer against real Kafka is in
tests/service/test_scaleout_rogue_member.py).
"""

from __future__ import annotations

import time

import pytest
from purgatory.adapters.kafka import (
    Member,
    OwnerProof,
    OwnersSnapshot,
    OwnerStatus,
    PartitionOwnership,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.ownership._ownership_guard import OwnershipGuard
from purgatory.adapters.kafka.settings import KafkaSettings, ScaleOutSettings
from purgatory.adapters.service import redirect_for
from pydantic import SecretStr
from structlog.testing import capture_logs

from purgatory.settings import ConfigError, load_settings

TOPIC = "orders"
ME, PEER, ROGUE = "http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:18999"
SECRET = "owner-proof-test-secret-0123456789"
GROUP = "purgatory-service"


def proof(secret: str | None = SECRET, trusted: tuple[str, ...] = (), group: str = GROUP) -> OwnerProof:
    return OwnerProof(group, SecretStr(secret) if secret is not None else None, trusted)


# -- the proof ----------------------------------------------------------------------------------


def test_an_instance_with_the_same_secret_verifies_and_its_url_is_read_back() -> None:
    verdict = proof().verify(proof().client_id(PEER))
    assert verdict.trusted and verdict.url == PEER and verdict.reason is None


def test_a_client_id_without_proof_is_not_trusted() -> None:
    verdict = proof().verify(ROGUE)
    assert not verdict.trusted and verdict.url == ROGUE and verdict.reason == "no proof in client.id"


@pytest.mark.parametrize(
    "client_id",
    [
        proof(secret="another-secret-0123456789abcdef").client_id(ROGUE),  # another secret
        proof(group="another-group").client_id(ROGUE),  # signed for another group
        proof().client_id(PEER).replace(PEER, ROGUE, 1),  # a genuine proof moved to another URL
        f"{ROGUE} proof=v1:{'0' * 64}",  # forged
        f"{ROGUE} proof=v1:é",  # not even hex
    ],
)
def test_a_proof_made_without_this_secret_group_and_url_does_not_verify(client_id: str) -> None:
    verdict = proof().verify(client_id)
    assert not verdict.trusted and verdict.url == ROGUE
    assert verdict.reason is not None and SECRET not in verdict.reason


def test_the_client_id_carries_no_secret() -> None:
    assert SECRET not in proof().client_id(ME)


def test_trusted_urls_alone_trust_exactly_those_urls() -> None:
    allow = proof(secret=None, trusted=(ME, PEER))
    assert allow.client_id(ME) == ME, "no secret: the client.id is the bare URL"
    assert allow.verify(PEER).trusted
    assert not allow.verify(ROGUE).trusted


def test_with_secret_and_trusted_urls_both_must_hold() -> None:
    both = proof(trusted=(ME, PEER))
    assert both.verify(both.client_id(PEER)).trusted
    assert not both.verify(PEER).trusted, "an allowed URL without proof"
    assert not both.verify(both.client_id(ROGUE)).trusted, "a proven URL not allowed"


def test_without_secret_or_trusted_urls_no_member_is_trusted() -> None:
    nothing = proof(secret=None)
    assert not nothing.configured and not nothing.verify(PEER).trusted


# -- what an unproven member's partitions get ---------------------------------------------------


def tp(partition: int) -> TopicPartitionKey:
    return TopicPartitionKey(TOPIC, partition)


def ownership() -> PartitionOwnership:
    settings = ScaleOutSettings(
        enabled=True, topics=(TOPIC,), advertised_url=ME, secret=SecretStr(SECRET), group_id=GROUP
    )
    return PartitionOwnership(KafkaSettings(bootstrap_servers="127.0.0.1:1"), settings)


def publish(owned: PartitionOwnership, members: dict[int, Member]) -> None:
    owned._snapshot = OwnersSnapshot(
        GROUP,
        "STABLE",
        tuple(set(members.values())),
        {tp(p): m for p, m in members.items()},
        time.monotonic(),
    )


def member(client_id: str, member_id: str) -> Member:
    verdict = proof().verify(client_id)
    return Member(member_id, verdict.url, "/127.0.0.1", frozenset(), verdict.trusted, verdict.reason)


def test_an_untrusted_members_partition_is_served_here_and_never_redirected_to() -> None:
    owned = ownership()
    owned._member_id = "me-1"
    publish(owned, {0: member(proof().client_id(PEER), "peer-1"), 1: member(ROGUE, "rogue-1")})
    assert owned.owner(tp(0)).status is OwnerStatus.OTHER and owned.owner(tp(0)).url == PEER
    rogue = owned.owner(tp(1))
    assert rogue.status is OwnerStatus.UNTRUSTED and rogue.url == ME and rogue.served_here
    assert owned.owns(tp(1))
    assert redirect_for(rogue, "/topics/orders/partitions/1/records?offset=0") is None, "no 307 to it"
    guard = OwnershipGuard(owned, [])
    assert guard.placement([tp(1)])() is None, "an operation waiting here stays here"


def test_a_member_claiming_this_instances_url_with_a_copied_proof_is_served_here() -> None:
    owned = ownership()
    owned._member_id = "me-1"
    publish(owned, {2: member(proof().client_id(ME), "impostor-1")})
    assert owned.owner(tp(2)).status is OwnerStatus.UNTRUSTED, "requests for it arrive here: serve them"


def test_an_untrusted_member_is_logged_once_without_the_secret() -> None:
    owned = ownership()
    rogue = member(ROGUE, "rogue-1")
    snapshot = OwnersSnapshot(GROUP, "STABLE", (rogue,), {tp(0): rogue}, time.monotonic())
    with capture_logs() as logs:
        for _ in range(3):
            owned._log_untrusted(snapshot)
    untrusted = [e for e in logs if e["event"] == "ownership_member_untrusted"]
    assert len(untrusted) == 1 and untrusted[0]["member_id"] == "rogue-1"
    assert untrusted[0]["reason"] == "no proof in client.id"
    assert SECRET not in repr(logs)


# -- settings: secure by default ----------------------------------------------------------------


def test_scaleout_refuses_to_start_without_secret_or_trusted_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_SCALEOUT__ENABLED", "true")
    monkeypatch.setenv("PURGATORY_SCALEOUT__TOPICS", '["orders"]')
    with pytest.raises(ConfigError, match=r"scaleout\.secret \(PURGATORY_SCALEOUT__SECRET"):
        load_settings()
    monkeypatch.setenv("PURGATORY_SCALEOUT__SECRET", SECRET)
    assert load_settings().scaleout.secret == SecretStr(SECRET)


def test_a_short_secret_is_refused_without_being_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURGATORY_SCALEOUT__SECRET", "short-pw")
    with pytest.raises(ConfigError, match=r"scaleout\.secret") as refused:
        load_settings()
    assert "short-pw" not in str(refused.value)


def test_the_advertised_url_must_be_one_of_the_trusted_urls() -> None:
    with pytest.raises(ValueError, match=r"not one of scaleout\.trusted_urls"):
        ScaleOutSettings(enabled=True, advertised_url=ME, trusted_urls=(PEER,))
    with pytest.raises(ValueError, match="trusted_urls"):
        ScaleOutSettings(trusted_urls=("127.0.0.1:8001",))
