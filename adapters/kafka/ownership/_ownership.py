"""PartitionOwnership: instances of one service split the watched partitions through Kafka's group protocol.

Kafka keeps a partition's purgatory on the partition's leader and tells clients where the leader
is. A service built on this library does the same with the engine its users already run: every
instance joins one consumer group (``group.id``, subscribed to the watched topics) and *owns* the
partitions the group assigns it. Nothing outside Kafka: no membership, gossip or election of our
own. Each member's ``client.id`` carries the URL it is reached at, and DescribeConsumerGroups maps
members to their assigned partitions, so any instance can say where a partition is owned::

    instance A (client.id=http://a:8080) ──┐
    instance B (client.id=http://b:8080) ──┼── group "svc" ── orders-0,1 → A  orders-2,3 → B ...
    instance C (client.id=http://c:8080) ──┘

The group consumer fetches nothing: every assigned partition is paused at once. It exists for
its membership (heartbeats run on librdkafka's own thread; ``poll`` serves the rebalance
callbacks). The assignor is ``cooperative-sticky``: a rebalance revokes only the partitions that
really move, so a new member takes over a share without disturbing the rest.

Any client that may join the group is a member, so a URL is believed only when the member proves
it is an instance (:class:`OwnerProof`: an HMAC of the URL with ``scaleout.secret`` next to it in
the ``client.id``, and/or ``scaleout.trusted_urls``). A partition held by a member that does not
is ``UNTRUSTED``: served here, and nothing — no client, no request — is sent to that member.

Revocation (a rebalance, this instance stopping, or the session lost) is told to listeners
*inside* the rebalance callback, before the partitions are handed over — the
:class:`OwnershipGuard` finishes every operation waiting on them with a ``Moved`` answer then.

``generation``: librdkafka does not expose the group's generation id to Python; this is the
member's own count of rebalance events (assignments, revocations, losses). It only grows, and
it changes whenever this instance's share changed.

Concurrency contract: ``start``/``close`` belong to the owner's thread. The group consumer runs
on one thread of its own (``kafka-ownership-<group>``), which also runs the rebalance callbacks
and the owners refresh; ``close()`` joins it and then closes the consumer on the calling thread
(the final revocation runs there). ``owner``, ``owned``, ``snapshot`` and ``stats`` may be
called from any thread: they read state swapped under a short lock.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from ..clients._config import client_config
from ..facts._keys import GroupPartitionKey, KafkaKey, TopicPartitionKey
from ..ops._moved import Moved, MovedReason
from ..settings import KafkaSettings, ScaleOutSettings
from ._owner_proof import OwnerProof
from ._owners import (
    NO_SNAPSHOT,
    Owner,
    OwnersSnapshot,
    OwnerStatus,
    describe_group,
    keys_of,
    snapshot_of,
)

__all__ = [
    "OwnershipListener",
    "OwnershipStats",
    "PartitionOwnership",
]

_log = structlog.get_logger("purgatory.kafka.ownership")

POLL_S = 0.1  # the group thread's poll: bounds how late a refresh request or a stop is seen
MIN_REFRESH_GAP_S = 0.1  # on-demand owner refreshes (unknown owner) at most this often
# After a rebalance the group is still CompletingRebalance for a moment: describe again soon.
UNSETTLED_REFRESH_S = 0.2
JOIN_TIMEOUT_S = 30.0  # the thread finishes its poll (POLL_S) or one describe (request timeout)
STATS_INTERVAL_MS = 1000


class OwnershipListener(Protocol):
    """Told of this instance's share changing (on the group thread, inside the rebalance callback)."""

    def on_assigned(self, partitions: frozenset[TopicPartitionKey], generation: int) -> None: ...

    def on_revoked(self, partitions: frozenset[TopicPartitionKey], moved: Moved) -> None: ...


@dataclass
class OwnershipStats:
    """Counters of the ownership layer (metrics read them at scrape time)."""

    assigned: int = 0  # rebalance callbacks that gave partitions
    revoked: int = 0  # ... that took partitions away (rebalance or shutdown)
    lost: int = 0  # ... that reported the session lost
    describes: int = 0  # DescribeConsumerGroups requests sent
    describe_failures: int = 0
    listener_errors: int = 0
    consumer_requests: int = 0  # requests the group consumer sent (librdkafka statistics, every 1 s)
    events: list[str] = field(default_factory=list)  # last rebalance events, for /owners


MAX_EVENTS = 20


def _topic_matcher(topics: Iterable[str]) -> Callable[[str], bool]:
    names = {t for t in topics if not t.startswith("^")}
    patterns = [re.compile(t) for t in topics if t.startswith("^")]  # librdkafka: ^ marks a regex
    return lambda topic: topic in names or any(p.match(topic) for p in patterns)


class PartitionOwnership:
    """Membership of this instance in the ownership group (see the module docstring)."""

    def __init__(
        self,
        settings: KafkaSettings,
        scaleout: ScaleOutSettings,
        *,
        advertised_url: str | None = None,
        bootstrap_servers: str | None = None,
    ) -> None:
        url = advertised_url or scaleout.advertised_url
        if not url:
            raise ValueError("scaleout.advertised_url must be set: other instances redirect clients to it")
        if not scaleout.topics:
            raise ValueError("scaleout.topics must name at least one topic whose partitions are split")
        self.url = url
        self.group_id = scaleout.group_id
        self.topics = tuple(scaleout.topics)
        self.scaleout = scaleout
        self.proof = OwnerProof(scaleout.group_id, scaleout.secret, scaleout.trusted_urls)
        self._distrust_logged: frozenset[str] = frozenset()  # member ids already logged untrusted
        self._settings = settings
        self._bootstrap = bootstrap_servers
        self._covers = _topic_matcher(self.topics)
        self._lock = threading.Lock()
        self._owned: frozenset[TopicPartitionKey] = frozenset()
        self._generation = 0
        self._changed_at = time.monotonic()
        self._snapshot = NO_SNAPSHOT
        self._member_id: str | None = None
        self._listeners: list[OwnershipListener] = []
        self._refresh_wanted = threading.Event()
        self._next_refresh = 0.0
        self._last_refresh = float("-inf")
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self._closing_reason: MovedReason = "revoked"
        self.stats = OwnershipStats()

    # -- lifecycle ------------------------------------------------------------------------------

    def add_listener(self, listener: OwnershipListener) -> None:
        self._listeners = [*self._listeners, listener]  # copy-on-write: callbacks never lock

    def remove_listener(self, listener: OwnershipListener) -> None:
        self._listeners = [item for item in self._listeners if item is not listener]

    def start(self) -> PartitionOwnership:
        """Join the group (the first assignment arrives after the group's join round, asynchronously)."""
        if self._thread is not None:
            return self
        timeouts = self.scaleout
        config: dict[str, Any] = {
            **client_config(self._settings, self._bootstrap),
            "group.id": self.group_id,
            # The URL travels as client.id: DescribeConsumerGroups shows it next to each
            # member's assignment, so no other channel is needed to find a partition's owner.
            # With its proof (OwnerProof): other instances trust it only if that verifies.
            "client.id": self.proof.client_id(self.url),
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": str(timeouts.session_timeout_ms),
            "heartbeat.interval.ms": str(timeouts.heartbeat_interval_ms),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest",
            "log_level": "0",
            # librdkafka's statistics count the requests this member sends (heartbeats, joins,
            # metadata): the ownership's own load on the cluster, reported by the bench.
            "statistics.interval.ms": str(STATS_INTERVAL_MS),
            "stats_cb": self._on_stats,
        }
        self._consumer = Consumer(config)
        self._consumer.subscribe(
            list(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"kafka-ownership-{self.group_id}", daemon=True
        )
        self._thread.start()
        _log.info("ownership_joining", group=self.group_id, url=self.url, topics=list(self.topics))
        return self

    def close(self, reason: MovedReason = "shutdown") -> None:
        """Leave the group: every owned partition is revoked (listeners move its operations) first."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(JOIN_TIMEOUT_S)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            self._closing_reason = reason
            try:
                consumer.close()  # runs on_revoke for what is owned, then LeaveGroup: others rebalance now
            except KafkaException as exc:
                _log.warning("ownership_close_failed", group=self.group_id, error=str(exc))
        if self._owned:  # no callback ran (never joined, or the cluster is gone): revoke ourselves
            self._revoke(self._owned, reason)
        _log.info("ownership_left", group=self.group_id, url=self.url)

    # -- answers (any thread) -------------------------------------------------------------------

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def member_id(self) -> str | None:
        return self._member_id

    def owned(self) -> frozenset[TopicPartitionKey]:
        return self._owned

    def snapshot(self) -> OwnersSnapshot:
        return self._snapshot

    def covers(self, topic: str) -> bool:
        """True if ``topic``'s partitions are split by the group (else any instance serves it)."""
        return self._covers(topic)

    def owns(self, key: KafkaKey) -> bool:
        """True if this instance serves ``key`` (owned, of a topic the group does not split, or
        held by an untrusted member)."""
        return self.owner(key).served_here

    def owner(self, key: KafkaKey) -> Owner:
        """Who owns ``key``'s partition (see :class:`OwnerStatus`); never blocks on Kafka."""
        if not isinstance(key, TopicPartitionKey | GroupPartitionKey) or not self._covers(key.topic):
            return Owner(OwnerStatus.UNMANAGED, self.url)
        tp = key if isinstance(key, TopicPartitionKey) else TopicPartitionKey(key.topic, key.partition)
        with self._lock:
            owned, generation, changed_at, snapshot = (
                self._owned, self._generation, self._changed_at, self._snapshot,
            )  # fmt: skip
        if tp in owned:
            return Owner(OwnerStatus.SELF, self.url, generation=generation)
        member = snapshot.owners.get(tp)
        stale = snapshot.taken_at < changed_at
        member_id = self._member_id
        if member is not None and not member.trusted:
            # Not shown to be an instance: nothing goes there (a forward would carry the client's
            # credentials to it); the partition is served here (docs/guide/scale-out.md).
            return Owner(OwnerStatus.UNTRUSTED, self.url, generation=generation)
        if (
            member is not None
            and not stale
            and member.url == self.url
            and member_id is not None
            and member.member_id != member_id
        ):
            # A describe newer than our last change shows another member with our URL (a copied
            # proof, or our own crashed incarnation until its session expires): requests for it
            # would be sent here anyway. Serve them. (A stale describe may still show our own
            # earlier state: that is the "moving" case below.)
            return Owner(OwnerStatus.UNTRUSTED, self.url, generation=generation)
        if member is None or member.member_id == member_id or member.url == self.url:
            # Unknown, or the snapshot still shows us, who no longer own it: the group is moving it.
            self._refresh_wanted.set()
            return Owner(OwnerStatus.NONE, None, moving=True, generation=generation)
        if stale or not snapshot.stable:
            self._refresh_wanted.set()
        return Owner(
            OwnerStatus.OTHER, member.url, moving=stale or not snapshot.stable, generation=generation
        )

    def describe(self) -> dict[str, Any]:
        """JSON-ready view of the group for ``/owners`` and ``purgatory kafka owners``."""
        snapshot = self._snapshot
        return {
            "group": self.group_id,
            "url": self.url,
            "member_id": self._member_id,
            "generation": self._generation,
            "owned": sorted(k.label for k in self._owned),
            "state": snapshot.state,
            "described_ms_ago": (
                None if snapshot is NO_SNAPSHOT else round((time.monotonic() - snapshot.taken_at) * 1000)
            ),
            "members": [
                {
                    "member_id": m.member_id,
                    "url": m.url,
                    "host": m.host,
                    "partitions": sorted(k.label for k in m.partitions),
                    "trusted": m.trusted,
                }
                for m in snapshot.members
            ],
            "events": list(self.stats.events),
        }

    def refresh(self, timeout_s: float | None = None) -> OwnersSnapshot:
        """DescribeConsumerGroups now (on the calling thread) and publish the result."""
        admin = self._admin_client()
        timeout = timeout_s if timeout_s is not None else self._settings.request_timeout_ms / 1000.0
        self.stats.describes += 1
        try:
            description = describe_group(admin, self.group_id, timeout)
        except Exception:
            self.stats.describe_failures += 1
            raise
        snapshot = snapshot_of(self.group_id, description, self.proof)
        with self._lock:
            self._snapshot = snapshot
        self._log_untrusted(snapshot)
        return snapshot

    def _log_untrusted(self, snapshot: OwnersSnapshot) -> None:
        # Once per member (not per describe): a rogue member must not be able to flood the log.
        logged = self._distrust_logged
        for member in snapshot.members:
            if member.trusted or member.member_id in logged:
                continue
            _log.warning(
                "ownership_member_untrusted",
                group=self.group_id,
                member_id=member.member_id[:200],
                url=member.url[:200],
                host=member.host,
                partitions=len(member.partitions),
                reason=member.distrust,
            )
        # Remember only current members: the set is bounded by the group's size.
        self._distrust_logged = frozenset(m.member_id for m in snapshot.members if not m.trusted)

    # -- the group thread -----------------------------------------------------------------------

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({**client_config(self._settings, self._bootstrap), "log_level": "0"})
        return self._admin

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None, "start() creates the consumer before the thread"
        while not self._stopping.is_set():
            try:
                message = consumer.poll(POLL_S)  # serves the rebalance callbacks; nothing is fetched
                if message is not None and message.error() is not None:
                    error = message.error()
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        _log.warning("ownership_consumer_error", group=self.group_id, error=error.str())
                if self._member_id is None:
                    self._member_id = consumer.memberid() or None
                self._maybe_refresh()
            except Exception:  # the membership thread must outlive any one failure
                _log.exception("ownership_poll_failed", group=self.group_id)
                self._stopping.wait(POLL_S)

    def _maybe_refresh(self) -> None:
        now = time.monotonic()
        wanted = self._refresh_wanted.is_set() and now - self._last_refresh >= MIN_REFRESH_GAP_S
        if not wanted and now < self._next_refresh:
            return
        self._refresh_wanted.clear()
        self._last_refresh = now
        try:
            snapshot = self.refresh()
        except Exception as exc:
            _log.warning("ownership_describe_failed", group=self.group_id, error=str(exc))
            self._next_refresh = now + UNSETTLED_REFRESH_S * 5
            return
        unsettled = not snapshot.stable or snapshot.taken_at - self._changed_at < UNSETTLED_REFRESH_S
        delay = UNSETTLED_REFRESH_S if unsettled else self.scaleout.owners_refresh_ms / 1000.0
        self._next_refresh = time.monotonic() + delay

    # Rebalance callbacks: on the group thread (inside poll) or on close()'s thread.

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Take the partitions, then pause them: the group is for ownership, not for reading.
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)
        added = keys_of(partitions)
        with self._lock:
            self._owned = self._owned | added
            self._generation += 1
            self._changed_at = time.monotonic()
            generation = self._generation
        self._member_id = consumer.memberid() or self._member_id
        self.stats.assigned += 1
        self._event(f"assigned {len(added)} -> owns {len(self._owned)} (generation {generation})")
        self._next_refresh = 0.0  # describe the new assignment at once
        for listener in self._listeners:
            try:
                listener.on_assigned(added, generation)
            except Exception:
                self.stats.listener_errors += 1
                _log.exception("ownership_listener_failed", group=self.group_id, callback="on_assigned")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        reason: MovedReason = self._closing_reason if self._stopping.is_set() else "revoked"
        self._revoke(keys_of(partitions), reason)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.stats.lost += 1
        self._revoke(keys_of(partitions), "lost")

    def _revoke(self, partitions: frozenset[TopicPartitionKey], reason: MovedReason) -> None:
        # Order matters (the submit-side re-check in OwnershipGuard relies on it): first the
        # partitions stop being owned, then listeners sweep what waits on them. An operation
        # watched after the sweep sees "not owned" when it is re-checked; one watched before is
        # found by the sweep.
        with self._lock:
            self._owned = self._owned - partitions
            self._generation += 1
            self._changed_at = time.monotonic()
            generation = self._generation
        self.stats.revoked += reason != "lost"
        self._event(f"{reason} {len(partitions)} -> owns {len(self._owned)} (generation {generation})")
        self._next_refresh = 0.0
        moved = Moved(reason, None, generation)
        for listener in self._listeners:
            try:
                listener.on_revoked(partitions, moved)
            except Exception:
                self.stats.listener_errors += 1
                _log.exception("ownership_listener_failed", group=self.group_id, callback="on_revoked")

    def _on_stats(self, document: str) -> None:
        try:
            brokers = json.loads(document).get("brokers", {})
            self.stats.consumer_requests = sum(int(b.get("tx", 0)) for b in brokers.values())
        except (ValueError, TypeError, AttributeError):
            _log.warning("ownership_stats_unreadable", group=self.group_id)

    def _event(self, text: str) -> None:
        events = self.stats.events
        events.append(text)
        if len(events) > MAX_EVENTS:
            del events[: len(events) - MAX_EVENTS]
        _log.info("ownership_changed", group=self.group_id, url=self.url, change=text)
