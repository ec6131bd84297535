"""Ownership without a cluster: who-owns answers, revocation moving operations, the redirect helper.

The group consumer is never started here: the rebalance callbacks are driven by hand (what
librdkafka calls on the group thread), the purgatory runs on a MockTimer, and the operations read
facts from a fake of our own FactSource port.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import TopicPartition
from purgatory.adapters.kafka import (
    DelayedReplication,
    ErrorCode,
    Member,
    Moved,
    OwnedOperation,
    Owner,
    OwnershipGuard,
    OwnersSnapshot,
    OwnerStatus,
    PartitionFacts,
    PartitionOwnership,
    TopicPartitionKey,
)
from purgatory.adapters.kafka.settings import KafkaSettings, ScaleOutSettings
from purgatory.adapters.service import moved_answer, redirect_for
from pydantic import SecretStr

from purgatory import DelayedOperation, DelayedOperationPurgatory, Outcome
from purgatory.testing import MockTimer

if TYPE_CHECKING:
    from purgatory.adapters.service.scaleout._scaleout import ScaleOut

TOPIC = "orders"
ME, OTHER = "http://127.0.0.1:8001", "http://127.0.0.1:8002"
SECRET = SecretStr("ownership-test-secret-0123456789")


class FakeFacts:
    """FactSource: high watermarks set by the test."""

    def __init__(self) -> None:
        self.settings = KafkaSettings()
        self.high: dict[TopicPartitionKey, int] = {}

    def partition(self, key: TopicPartitionKey) -> PartitionFacts | None:
        return PartitionFacts(high_watermark=self.high[key], leader_epoch=0) if key in self.high else None

    def topic(self, key: object) -> None:
        return None

    def group(self, key: object) -> None:
        return None

    @property
    def unavailable(self) -> str | None:
        return None


class FakeConsumer:
    """What the rebalance callbacks call on the consumer."""

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass

    def memberid(self) -> str:
        return "me-1"


class OwnedProduce(OwnedOperation, DelayedReplication):
    pass


def tp(partition: int) -> TopicPartitionKey:
    return TopicPartitionKey(TOPIC, partition)


@pytest.fixture
def ownership() -> PartitionOwnership:
    settings = ScaleOutSettings(enabled=True, secret=SECRET, topics=(TOPIC,), advertised_url=ME)
    return PartitionOwnership(KafkaSettings(bootstrap_servers="127.0.0.1:1"), settings)


@pytest.fixture
def purgatory() -> Iterator[DelayedOperationPurgatory[DelayedOperation]]:
    p: DelayedOperationPurgatory[DelayedOperation] = DelayedOperationPurgatory(
        "produce", timer=MockTimer(), reaper_enabled=False
    )
    yield p
    p.shutdown()


def assign(ownership: PartitionOwnership, *partitions: int) -> None:
    ownership._on_assign(FakeConsumer(), [TopicPartition(TOPIC, p) for p in partitions])  # type: ignore[arg-type]


def revoke(ownership: PartitionOwnership, *partitions: int) -> None:
    ownership._on_revoke(FakeConsumer(), [TopicPartition(TOPIC, p) for p in partitions])  # type: ignore[arg-type]


def publish(ownership: PartitionOwnership, owners: dict[int, str], state: str = "STABLE") -> None:
    members = {url: Member(f"{url}-id", url, "/127.0.0.1", frozenset()) for url in set(owners.values())}
    snapshot = OwnersSnapshot(
        "g", state, tuple(members.values()), {tp(p): members[u] for p, u in owners.items()}, time.monotonic()
    )
    ownership._snapshot = snapshot


class NoKeys:
    """Watched keys of nobody: the scale-out of a service whose feed follows nothing yet."""

    def watched_keys(self) -> frozenset[TopicPartitionKey]:
        return frozenset()


def service_scaleout(purgatory: DelayedOperationPurgatory[DelayedOperation]) -> ScaleOut:
    """The HTTP service's scale-out of this instance (ME) over ``purgatory``; nothing connects."""
    from purgatory.adapters.service.scaleout._scaleout import ScaleOut

    from purgatory.settings import Settings

    settings = Settings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        scaleout=ScaleOutSettings(enabled=True, secret=SECRET, topics=(TOPIC,), advertised_url=ME),
    )
    return ScaleOut(settings, "127.0.0.1:1", [purgatory], NoKeys())


# -- who owns this key ------------------------------------------------------------------------


def test_owner_is_self_for_assigned_partitions_and_unmanaged_for_other_topics(
    ownership: PartitionOwnership,
) -> None:
    assign(ownership, 0, 1)
    assert ownership.owner(tp(0)).status is OwnerStatus.SELF
    assert ownership.owner(TopicPartitionKey("audit", 0)).status is OwnerStatus.UNMANAGED
    assert ownership.owns(tp(1)) and not ownership.owns(tp(2))


def test_owner_of_another_members_partition_is_its_advertised_url(ownership: PartitionOwnership) -> None:
    assign(ownership, 0)
    publish(ownership, {0: ME, 1: OTHER})
    assert ownership.owner(tp(1)) == Owner(OwnerStatus.OTHER, OTHER, moving=False, generation=1)


def test_owner_is_moving_while_the_describe_is_older_than_our_last_rebalance(
    ownership: PartitionOwnership,
) -> None:
    publish(ownership, {0: ME, 1: OTHER})
    revoke(ownership, 0)  # after the snapshot was taken
    assert ownership.owner(tp(1)).moving, "a snapshot older than a rebalance may be stale"
    gone = ownership.owner(tp(0))
    assert gone.status is OwnerStatus.NONE, "the snapshot still names us, who no longer own it"


def test_owner_is_none_for_a_partition_no_member_holds(ownership: PartitionOwnership) -> None:
    publish(ownership, {1: OTHER})
    assert ownership.owner(tp(5)) == Owner(OwnerStatus.NONE, None, moving=True, generation=0)


def test_a_regex_topic_is_covered_like_librdkafka_subscribes_it() -> None:
    settings = ScaleOutSettings(enabled=True, secret=SECRET, topics=("^orders-.*",), advertised_url=ME)
    ownership = PartitionOwnership(KafkaSettings(bootstrap_servers="127.0.0.1:1"), settings)
    assert ownership.covers("orders-eu") and not ownership.covers("audit")


def test_ownership_needs_an_advertised_url_and_topics() -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    with pytest.raises(ValueError, match="advertised_url"):
        PartitionOwnership(kafka, ScaleOutSettings(enabled=True, secret=SECRET, topics=(TOPIC,)))
    with pytest.raises(ValueError, match="topics"):
        PartitionOwnership(kafka, ScaleOutSettings(enabled=True, secret=SECRET, advertised_url=ME))


def test_advertised_url_must_be_a_bare_http_url() -> None:
    with pytest.raises(ValueError, match="advertised_url"):
        ScaleOutSettings(advertised_url="127.0.0.1:8080")


# -- revocation moves what waits --------------------------------------------------------------


def test_revocation_moves_every_operation_on_the_revoked_partitions_at_once(
    ownership: PartitionOwnership, purgatory: DelayedOperationPurgatory[DelayedOperation]
) -> None:
    facts = FakeFacts()
    guard = OwnershipGuard(ownership, [purgatory])
    assign(ownership, 0, 1, 2)
    ops = {p: DelayedReplication(facts, {tp(p): 10}, delay_ms=30_000) for p in (0, 1, 2)}
    for op in ops.values():
        guard.submit(purgatory, op, op.watch_keys())
    assert purgatory.num_delayed() == 3
    revoke(ownership, 0, 1)
    for p in (0, 1):
        op = ops[p]
        assert op.outcome is Outcome.COMPLETED and op.moved is not None, f"partition {p} answered at once"
        assert op.moved.reason == "revoked" and op.moved.generation == ownership.generation
        assert op.statuses == {tp(p): ErrorCode.NOT_LEADER_OR_FOLLOWER}, "no replication was claimed"
    assert ops[2].outcome is None, "partitions kept are not disturbed"
    assert purgatory.num_delayed() == 1 and guard.moved == 2


def test_shutdown_revocation_says_shutdown(
    ownership: PartitionOwnership, purgatory: DelayedOperationPurgatory[DelayedOperation]
) -> None:
    facts = FakeFacts()
    OwnershipGuard(ownership, [purgatory])
    assign(ownership, 0)
    op = DelayedReplication(facts, {tp(0): 10}, delay_ms=30_000)
    purgatory.try_complete_else_watch(op, op.watch_keys())
    ownership.close()  # never started: no consumer to close, so it revokes what it owns itself
    assert op.moved is not None and op.moved.reason == "shutdown"
    assert ownership.owned() == frozenset()


def test_an_operation_submitted_while_its_partition_is_revoked_moves_by_its_own_try(
    ownership: PartitionOwnership, purgatory: DelayedOperationPurgatory[DelayedOperation]
) -> None:
    """The window: the route check said "ours", then the revocation swept, then the op was watched."""
    facts = FakeFacts()
    guard = OwnershipGuard(ownership, [purgatory])
    assign(ownership, 0)
    publish(ownership, {0: ME})
    op = OwnedProduce(facts, {tp(0): 10}, delay_ms=30_000)
    op.placement = guard.placement(op.watch_keys())
    revoke(ownership, 0)  # the sweep ran before the submission: nothing to find yet
    purgatory.try_complete_else_watch(op, op.watch_keys())
    assert op.moved is not None and op.moved.reason == "not_owner", (
        "moved by its first try, never left waiting"
    )
    assert purgatory.num_delayed() == 0 and purgatory.watched() == 0


def test_move_loses_to_a_completion_that_came_first(
    purgatory: DelayedOperationPurgatory[DelayedOperation],
) -> None:
    facts = FakeFacts()
    op = DelayedReplication(facts, {tp(0): 10}, delay_ms=30_000)
    purgatory.try_complete_else_watch(op, op.watch_keys())
    facts.high[tp(0)] = 11
    assert purgatory.check_and_complete(tp(0)) == 1
    assert not op.move(Moved("revoked")), "finishing is claimed once"
    assert op.moved is None and op.statuses == {tp(0): ErrorCode.NONE}


def test_move_racing_expiry_answers_exactly_once(
    purgatory: DelayedOperationPurgatory[DelayedOperation],
) -> None:
    """Many rounds of move() on one thread against expiry (run()) on another: one answer each, consistent."""
    facts = FakeFacts()
    for _ in range(200):
        op = DelayedReplication(facts, {tp(0): 10}, delay_ms=30_000)
        finished: list[Outcome | None] = []
        op.on_response = lambda o, finished=finished: finished.append(o.outcome)
        start = threading.Barrier(2)

        def expire(op: DelayedReplication = op, start: threading.Barrier = start) -> None:
            start.wait()
            op.run()

        expiry = threading.Thread(target=expire)
        expiry.start()
        start.wait()
        moved = op.move(Moved("revoked"))
        expiry.join()
        assert len(finished) == 1, "one answer"
        if moved:
            assert op.outcome is Outcome.COMPLETED and op.moved is not None
            assert op.statuses[tp(0)] is ErrorCode.NOT_LEADER_OR_FOLLOWER
        else:
            assert op.outcome is Outcome.EXPIRED and op.moved is None
            assert op.statuses[tp(0)] is ErrorCode.REQUEST_TIMED_OUT


class PlainOp(DelayedOperation):
    """Not a Kafka operation: it cannot carry a Moved answer."""

    def __init__(self) -> None:
        super().__init__(30_000)
        self.completions = 0

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        self.completions += 1


def test_an_operation_that_cannot_move_expires_at_once_rather_than_wait(
    ownership: PartitionOwnership, purgatory: DelayedOperationPurgatory[DelayedOperation]
) -> None:
    guard = OwnershipGuard(ownership, [purgatory])
    assign(ownership, 0)
    op = PlainOp()
    purgatory.try_complete_else_watch(op, [tp(0)])
    revoke(ownership, 0)
    assert op.outcome is Outcome.EXPIRED and op.completions == 1
    assert guard.expired == 1 and purgatory.num_delayed() == 0


# -- redirect helper --------------------------------------------------------------------------


def test_redirect_for_answers_307_to_the_owner_with_retry_after_only_while_moving() -> None:
    path = "/topics/orders/partitions/1/records?offset=5"
    steady = redirect_for(Owner(OwnerStatus.OTHER, OTHER), path)
    assert steady is not None and steady.status == 307
    assert steady.headers == {"Location": OTHER + path}
    moving = redirect_for(Owner(OwnerStatus.OTHER, OTHER, moving=True), path, retry_after_s=2)
    assert moving is not None and moving.headers["Retry-After"] == "2"


def test_redirect_for_answers_503_while_nobody_owns_it_and_nothing_when_it_is_ours() -> None:
    none = redirect_for(Owner(OwnerStatus.NONE, None, moving=True), "/x")
    assert none is not None and none.status == 503 and none.headers == {"Retry-After": "1"}
    assert redirect_for(Owner(OwnerStatus.SELF, ME), "/x") is None
    assert redirect_for(Owner(OwnerStatus.UNMANAGED, ME), "/x") is None


def test_moved_answer_points_at_the_new_owner_or_asks_to_retry() -> None:
    known = moved_answer(
        Moved("revoked", OTHER, 7), "/topics/orders/replicated?offsets=0:4", status_if_known=303
    )
    assert (
        known.status == 303 and known.headers["Location"] == OTHER + "/topics/orders/replicated?offsets=0:4"
    )
    assert known.body["outcome"] == "MOVED" and known.body["generation"] == 7
    unknown = moved_answer(Moved("shutdown"), "/x")
    assert unknown.status == 503 and unknown.headers == {"Retry-After": "1", "Location": "/x"}


def test_a_lost_session_moves_operations_with_reason_lost(
    ownership: PartitionOwnership, purgatory: DelayedOperationPurgatory[DelayedOperation]
) -> None:
    OwnershipGuard(ownership, [purgatory])
    assign(ownership, 3)
    op = DelayedReplication(FakeFacts(), {tp(3): 1}, delay_ms=30_000)
    purgatory.try_complete_else_watch(op, op.watch_keys())
    ownership._on_lost(FakeConsumer(), [TopicPartition(TOPIC, 3)])  # type: ignore[arg-type]
    assert op.moved is not None and op.moved.reason == "lost"
    assert ownership.stats.lost == 1 and ownership.owned() == frozenset()


def test_a_moved_replication_wait_carries_its_offsets_and_leader_epochs_to_the_new_owner(
    purgatory: DelayedOperationPurgatory[DelayedOperation],
) -> None:
    """The continuation keeps the produce's fence: the new owner checks the same leader epoch."""
    from urllib.parse import parse_qs, urlsplit

    from purgatory.adapters.kafka import Appended

    scaleout = service_scaleout(purgatory)
    op = DelayedReplication(
        FakeFacts(), Appended({tp(1): 41, tp(0): 7}, {tp(1): 5, tp(0): 3}), delay_ms=30_000
    )
    assert op.move(Moved("revoked", OTHER, 4))
    answer = scaleout.moved_replication(TOPIC, op, time.monotonic(), 30_000)
    assert answer is not None
    assert answer.status_code == 307, "a GET of the replication wait: the records are not appended again"
    location = urlsplit(answer.headers["location"])
    assert (
        f"{location.scheme}://{location.netloc}" == OTHER and location.path == f"/topics/{TOPIC}/replicated"
    )
    query = parse_qs(location.query)
    assert query["offsets"] == ["0:7,1:41"] and query["epochs"] == ["0:3,1:5"]
    assert 29_000 <= int(query["timeout_ms"][0]) <= 30_000, "what remains of the produce's timeout"


def test_a_moved_replication_wait_with_a_partition_of_unknown_epoch_is_answered_here_never_sent_on_unfenced(
    purgatory: DelayedOperationPurgatory[DelayedOperation],
) -> None:
    """One partition without an epoch before the append must not strip the others' fences: a
    query of bare offsets would let the new owner answer NONE for a record a leader change lost."""
    from purgatory.adapters.kafka import Appended, FetchedRecord, RecordIdentity
    from purgatory.adapters.service.scaleout._scaleout import replicated_query

    class NoRecords:
        def read(
            self, key: TopicPartitionKey, start: int, end: int, *, max_bytes: int
        ) -> list[FetchedRecord]:
            return []

    scaleout = service_scaleout(purgatory)
    identities = {tp(p): (RecordIdentity.of(o, None, b"v", 1_000),) for p, o in ((0, 7), (1, 41))}
    appended = Appended({tp(1): 41, tp(0): 7}, {tp(1): 5}, identities, NoRecords())
    op = DelayedReplication(FakeFacts(), appended, delay_ms=30_000)
    assert replicated_query(op, 30_000) is None
    assert op.move(Moved("revoked", OTHER, 4))
    assert scaleout.moved_replication(TOPIC, op, time.monotonic(), 30_000) is None, "answered here"
    assert op.statuses == {tp(0): ErrorCode.NOT_LEADER_OR_FOLLOWER, tp(1): ErrorCode.NOT_LEADER_OR_FOLLOWER}


def test_plain_target_offsets_moved_before_every_epoch_was_seen_travel_as_plain_targets(
    purgatory: DelayedOperationPurgatory[DelayedOperation],
) -> None:
    from purgatory.adapters.service.scaleout._scaleout import replicated_query

    op = DelayedReplication(FakeFacts(), {tp(1): 41, tp(0): 7}, delay_ms=30_000)
    query = replicated_query(op, 30_000)
    assert query is not None and "epochs" not in query and query["offsets"] == "0:7,1:41"
