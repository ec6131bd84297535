"""ClusterView: the facts delayed operations need, read from Kafka in batches.

Every question is answered for many keys with one admin request per *kind* of fact:

==========================  =====================================  ==========================
fact                        Kafka request (confluent-kafka admin)   batched over
==========================  =====================================  ==========================
topic existence, leaders,   DescribeTopics (``describe_topics``)    all topics asked about
ISR, replicas
high watermark, leader      ListOffsets latest (``list_offsets``)   all partitions asked about
epoch
log start offset            ListOffsets earliest                    partitions that need it
min.insync.replicas         DescribeConfigs (cached ``CONFIG_TTL``) all topics asked about
committed offsets           OffsetFetch (``Consumer.committed``)    one per *group*, in parallel
==========================  =====================================  ==========================

Committed offsets are read by a non-joining :class:`confluent_kafka.Consumer` per watched group
(:class:`_CommittedOffsetReaders` in ``_group_offsets.py``), not by the admin client's
ListConsumerGroupOffsets: that admin request aborts the whole process
(``rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0``, librdkafka issue #4605)
when it times out on a frozen or dropped broker connection. The consumer's OffsetFetch goes
through the consumer-group handle instead, which times out cleanly.

:meth:`ClusterView.facts` is what the change feed calls each interval. DescribeTopics says which
partitions exist; ListOffsets is sent in parallel with it for partitions already known to exist
(so a poll costs one round trip), and after it only for partitions seen for the first time — so
ListOffsets is asked only about partitions known to exist, and one bad key cannot spoil the batch.
ListOffsets(earliest) is sent only for the partitions named in ``log_start_for``.

The admin client is created lazily on first use (no network in ``__init__``) and rebuilt by
:meth:`reconnect`. Errors are translated: an unreachable cluster raises
:class:`KafkaUnavailableError`; per-key problems (unknown topic or partition) are returned as
:class:`ErrorFact` values in the facts, or raised as typed errors by the single-kind methods.

Concurrency contract: thread-safe. librdkafka's admin client and consumers are thread-safe; the
lazy creation and the config cache are guarded by a lock. ``requests_sent`` counts requests
issued (one per admin request, one per group's OffsetFetch).

The facts it answers with, and how a client error becomes one, are in ``_facts.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    ConfigResource,
    OffsetSpec,
)

from ..clients._config import client_config, redacted
from ..clients._errors import KafkaUnavailableError
from ..settings import KafkaSettings
from ._facts import (
    NO_LEADER,
    ClusterFacts,
    ErrorFact,
    GroupFacts,
    PartitionFacts,
    TopicFacts,
    _error_fact,
    _unavailable_or,
)
from ._group_offsets import _CommittedOffsetReaders
from ._keys import GroupPartitionKey, TopicKey, TopicPartitionKey
from ._list_offsets import ListedOffset, _PendingOffsets

__all__ = ["ClusterView"]

_log = structlog.get_logger("purgatory.kafka.view")

# A stale leader epoch renews the admin client at most this often (a new one costs connections).
ADMIN_RENEW_MIN_S = 1.0
CONFIG_TTL_S = 10.0  # min.insync.replicas rarely changes; re-read it at most this often per topic
_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
_EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class _TopicDescription:
    leaders: tuple[int, ...]
    isr: tuple[tuple[int, ...], ...]
    replicas: tuple[tuple[int, ...], ...]


def _answered_error(exc: BaseException, what: str, topic: str | None = None) -> ErrorFact:
    """The error one item of a batched answer carries; an unavailable cluster fails the whole
    batch instead (KafkaUnavailableError), since no other item's answer can be trusted either."""
    fact = _error_fact(exc, what, topic)
    if fact.kind == "unavailable":
        raise KafkaUnavailableError(fact.message) from None
    return fact


class ClusterView:
    """Batched, typed answers about a Kafka cluster (see the module docstring)."""

    def __init__(
        self,
        settings: KafkaSettings | None = None,
        *,
        bootstrap_servers: str | None = None,
        request_timeout_ms: int | None = None,
    ) -> None:
        self._settings = settings or KafkaSettings()
        self._bootstrap = bootstrap_servers
        # The cluster asked (None: settings.bootstrap_servers); the change feed's tail joins it too.
        self.bootstrap_servers = bootstrap_servers or self._settings.bootstrap_servers
        self.request_timeout_s = (request_timeout_ms or self._settings.request_timeout_ms) / 1000.0
        self._lock = threading.Lock()
        self._admin: AdminClient | None = None
        self._admin_renewed_at = -ADMIN_RENEW_MIN_S
        self._min_isr: dict[str, tuple[float, int]] = {}
        # Partition count per topic as last described: lets facts() ask ListOffsets for known
        # partitions in parallel with DescribeTopics (one round trip per poll, not two).
        self._partition_counts: dict[str, int] = {}
        # The last DescribeTopics answer per topic: facts(refresh_metadata=False) reuses it.
        self._descriptions: dict[str, _TopicDescription | ErrorFact] = {}
        # Requests issued (one per call; a batch counts once). Read by benchmarks/metrics.
        self.requests_sent = 0
        self._group_readers = _CommittedOffsetReaders(self._group_config, self.request_timeout_s)

    # -- connection -----------------------------------------------------------------------------

    @property
    def admin(self) -> AdminClient:
        admin = self._admin
        if admin is None:
            with self._lock:
                if self._admin is None:
                    config: dict[str, str | int | float | bool] = {
                        **client_config(self._settings, self._bootstrap)
                    }
                    # librdkafka logs its own connection errors to stderr; we report ours.
                    config.setdefault("log_level", "0")
                    # Small request/response pairs every interval: Nagle plus delayed ACKs could
                    # hold a request back tens of milliseconds.
                    config.setdefault("socket.nagle.disable", True)
                    _log.debug("kafka_admin_connect", config=redacted(config))
                    self._admin = AdminClient(config)
                admin = self._admin
        return admin

    def _group_config(self, group: str) -> dict[str, str | int | float | bool]:
        """Config of the consumer that reads ``group``'s committed offsets without joining it."""
        config: dict[str, str | int | float | bool] = {
            **client_config(self._settings, self._bootstrap),
            "group.id": group,
            # It never subscribes (so never joins the group) and must never commit for it.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        config.setdefault("log_level", "0")  # as for the admin client: we report the errors
        config.setdefault("socket.nagle.disable", True)
        _log.debug("kafka_group_reader_connect", config=redacted(config))
        return config

    def reconnect(self) -> None:
        """Drop the admin client and the group readers; the next request builds fresh ones."""
        with self._lock:
            self._admin = None
        self._group_readers.retain(())

    def close(self) -> None:
        """Drop every client (group readers are closed off the caller's thread)."""
        self.reconnect()
        self._group_readers.shutdown()

    def _count(self, requests: int = 1) -> None:
        self.requests_sent += requests  # single writer in practice (the feed); a lost count is harmless

    def _result(self, future: Future[Any], what: str) -> Any:
        try:
            return future.result(timeout=self.request_timeout_s + 1.0)
        except TimeoutError:
            raise KafkaUnavailableError(
                f"Kafka did not answer {what} within {self.request_timeout_s:.1f} s"
            ) from None

    # -- DescribeTopics -------------------------------------------------------------------------

    def _start_describe(self, topics: Iterable[str]) -> dict[str, Future[Any]]:
        names = sorted(set(topics))
        if not names:
            return {}
        self._count()
        try:
            futures: dict[str, Future[Any]] = self.admin.describe_topics(
                TopicCollection(names), request_timeout=self.request_timeout_s
            )
        except KafkaException as exc:
            raise _unavailable_or(exc, "DescribeTopics") from None
        return futures

    def _finish_describe(
        self, futures: Mapping[str, Future[Any]]
    ) -> dict[str, _TopicDescription | ErrorFact]:
        out: dict[str, _TopicDescription | ErrorFact] = {}
        wait(futures.values(), timeout=self.request_timeout_s + 1.0)
        for name, future in futures.items():
            try:
                description = self._result(future, f"DescribeTopics({name})")
            except KafkaException as exc:
                fact = _answered_error(exc, f"topic {name!r}", name)
                out[name] = fact
                self._partition_counts.pop(name, None)
                self._descriptions[name] = fact
                continue
            partitions = sorted(description.partitions, key=lambda p: p.id)
            out[name] = _TopicDescription(
                leaders=tuple(p.leader.id if p.leader is not None else NO_LEADER for p in partitions),
                isr=tuple(tuple(sorted(n.id for n in p.isr)) for p in partitions),
                replicas=tuple(tuple(n.id for n in p.replicas) for p in partitions),
            )
            self._partition_counts[name] = len(partitions)
            self._descriptions[name] = out[name]
        return out

    def _describe(self, topics: Iterable[str]) -> dict[str, _TopicDescription | ErrorFact]:
        return self._finish_describe(self._start_describe(topics))

    def topic_exists(self, topics: Iterable[str]) -> dict[str, bool]:
        """Which of ``topics`` exist (one DescribeTopics request).

        False only where Kafka answered that the topic does not exist; any other answer raises
        its typed error (:class:`KafkaUnavailableError` when the cluster did not answer): an
        outage is never reported as a missing topic.
        """
        out = {}
        for name, d in self._describe(topics).items():
            if isinstance(d, ErrorFact) and d.kind != "unknown_topic":
                raise d.to_exception()
            out[name] = isinstance(d, _TopicDescription)
        return out

    def partition_counts(self, topics: Iterable[str]) -> dict[str, int | None]:
        """Each topic's partition count, ``None`` where Kafka answered that it does not exist.

        One DescribeTopics request. A topic whose answer says neither (an authorization or other
        error) is left out: the caller cannot conclude anything about it. Raises
        :class:`KafkaUnavailableError` when the cluster did not answer.
        """
        out: dict[str, int | None] = {}
        for name, d in self._describe(topics).items():
            if isinstance(d, _TopicDescription):
                out[name] = len(d.leaders)
            elif d.kind == "unknown_topic":
                out[name] = None
        return out

    def topics(self, keys: Iterable[TopicKey]) -> dict[TopicKey, TopicFacts]:
        """Leaders of every partition of each topic; raises :class:`UnknownTopicError` for a missing one."""
        keys = list(keys)
        described = self._describe(k.topic for k in keys)
        out = {}
        for key in keys:
            d = described[key.topic]
            if isinstance(d, ErrorFact):
                raise d.to_exception()
            out[key] = TopicFacts(d.leaders)
        return out

    # -- ListOffsets ----------------------------------------------------------------------------

    def _list_offsets(
        self, keys: list[TopicPartitionKey], spec: OffsetSpec, what: str
    ) -> _PendingOffsets | None:
        """Send one ListOffsets request for ``keys``; collect the answers later (requests overlap)."""
        if not keys:
            return None
        self._count()
        request = {TopicPartition(k.topic, k.partition): spec for k in keys}
        try:
            futures = self.admin.list_offsets(request, request_timeout=self.request_timeout_s)
        except KafkaException as exc:
            raise _unavailable_or(exc, what) from None
        return _PendingOffsets(futures, what, self.request_timeout_s + 1.0, self._forget_leader_epochs)

    def _forget_leader_epochs(self) -> None:
        """A ListOffsets answer said the client's leader epoch is stale (FENCED_LEADER_EPOCH).

        librdkafka's admin client sends the epoch of its cached metadata with ListOffsets and does
        not refresh it on this error: after a leader bounced, every later ListOffsets of the
        partition was refused (seen for minutes). A new admin client starts from fresh metadata.
        """
        now = time.monotonic()
        with self._lock:
            if now - self._admin_renewed_at < ADMIN_RENEW_MIN_S:
                return  # renewed a moment ago: its metadata is fresh, the broker is catching up
            self._admin_renewed_at = now
            self._admin = None
        _log.info("kafka_admin_stale_leader_epoch")

    def _offsets(
        self, keys: Iterable[TopicPartitionKey], spec: OffsetSpec, what: str
    ) -> dict[TopicPartitionKey, int]:
        keys = list(dict.fromkeys(keys))
        pending = self._list_offsets(keys, spec, what)
        if pending is None:
            return {}
        results = pending.collect()
        return {key: self._listed(key, results[key]).offset for key in keys}

    def _listed(self, key: TopicPartitionKey, value: ListedOffset | ErrorFact) -> ListedOffset:
        """One partition's ListOffsets answer, or the typed error it stands for."""
        if isinstance(value, ErrorFact):
            if value.kind == "unknown_topic" and self._partition_counts.get(key.topic, 0) > key.partition:
                # DescribeTopics said it exists: "no leader found" means leaderless for now
                # (its leader is down or being elected), not unknown — as in facts().
                raise KafkaUnavailableError(f"partition {key.label} has no leader: {value.message}")
            raise value.to_exception()
        if value.offset < 0:
            # librdkafka's "no offset" (-1, OFFSET_INVALID -1001): the leader could not say.
            raise KafkaUnavailableError(f"the leader of {key.label} answered no offset ({value.offset})")
        return value

    def high_watermarks(self, keys: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Latest offset (the high watermark) per partition, in one ListOffsets request."""
        return self._offsets(keys, _LATEST, "ListOffsets(latest)")

    def leader_epochs(self, keys: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Each partition's current leader epoch, as its leader answers ListOffsets(latest).

        Raises :class:`KafkaUnavailableError` for a partition whose leader gives no epoch (a
        broker too old for ListOffsets v4, or a leader still loading after an election).
        """
        keys = list(dict.fromkeys(keys))
        pending = self._list_offsets(keys, _LATEST, "ListOffsets(latest)")
        if pending is None:
            return {}
        results = pending.collect()
        out = {}
        for key in keys:
            epoch = self._listed(key, results[key]).leader_epoch
            if epoch is None:
                raise KafkaUnavailableError(f"the leader of {key.label} did not say its leader epoch")
            out[key] = epoch
        return out

    def partition_count(self, topic: str) -> int:
        """``topic``'s partition count as last described (DescribeTopics when never described)."""
        count = self._partition_counts.get(topic)
        if count is None:
            described = self._describe([topic])[topic]
            if isinstance(described, ErrorFact):
                raise described.to_exception()
            count = len(described.leaders)
        return count

    def log_start_offsets(self, keys: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Earliest offset (the log start offset) per partition, in one ListOffsets request."""
        return self._offsets(keys, _EARLIEST, "ListOffsets(earliest)")

    # -- DescribeConfigs ------------------------------------------------------------------------

    def min_insync_replicas(self, topics: Iterable[str]) -> dict[str, int]:
        """``min.insync.replicas`` per topic (cached for ``CONFIG_TTL_S``; one request for the misses)."""
        now = time.monotonic()
        names = set(topics)
        out = {t: v for t, (at, v) in self._min_isr.items() if t in names and now - at < CONFIG_TTL_S}
        missing = sorted(names - out.keys())
        if missing:
            self._count()
            try:
                futures = self.admin.describe_configs(
                    [ConfigResource(ConfigResource.Type.TOPIC, t) for t in missing],
                    request_timeout=self.request_timeout_s,
                )
            except KafkaException as exc:
                raise _unavailable_or(exc, "DescribeConfigs") from None
            for resource, future in futures.items():
                try:
                    configs = self._result(future, f"DescribeConfigs({resource.name})")
                except KafkaException as exc:
                    _answered_error(exc, f"topic {resource.name!r}")
                    continue  # unknown topic: DescribeTopics reports it
                value = int(configs["min.insync.replicas"].value)
                self._min_isr[resource.name] = (now, value)
                out[resource.name] = value
        return out

    # -- OffsetFetch (committed offsets) -------------------------------------------------------

    def _group_offsets(self, group: str, keys: list[GroupPartitionKey]) -> Future[Any]:
        self._count()
        return self._group_readers.committed(group, [TopicPartition(k.topic, k.partition) for k in keys])

    @property
    def group_readers(self) -> frozenset[str]:
        """Groups whose offset reader (a non-joining consumer) is open now."""
        return self._group_readers.groups

    def retain_groups(self, groups: Iterable[str]) -> None:
        """Close the group readers of every group not in ``groups`` (no longer watched)."""
        self._group_readers.retain(groups)

    def committed_offsets(self, keys: Iterable[GroupPartitionKey]) -> dict[GroupPartitionKey, int | None]:
        """Committed offset per (group, partition); ``None`` where the group committed nothing."""
        facts = self._groups(list(dict.fromkeys(keys)))
        out: dict[GroupPartitionKey, int | None] = {}
        for key, fact in facts.items():
            if fact.error is not None:
                raise fact.error.to_exception()
            out[key] = fact.committed
        return out

    def _start_groups(
        self, keys: list[GroupPartitionKey]
    ) -> dict[str, tuple[list[GroupPartitionKey], Future[Any]]]:
        by_group: dict[str, list[GroupPartitionKey]] = {}
        for key in keys:
            by_group.setdefault(key.group, []).append(key)
        return {group: (ks, self._group_offsets(group, ks)) for group, ks in by_group.items()}

    def _finish_groups(
        self, started: Mapping[str, tuple[list[GroupPartitionKey], Future[Any]]]
    ) -> dict[GroupPartitionKey, GroupFacts]:
        out: dict[GroupPartitionKey, GroupFacts] = {}
        for group, (keys, future) in started.items():
            try:
                partitions = self._result(future, f"OffsetFetch({group})")
            except KafkaException as exc:
                fact = _answered_error(exc, f"group {group!r}")
                out.update({k: GroupFacts(error=fact) for k in keys})
                continue
            committed = {}
            for tp in partitions:
                key = GroupPartitionKey(group, tp.topic, tp.partition)
                if tp.error is not None:
                    out[key] = GroupFacts(error=ErrorFact("other", f"{key.label}: {tp.error}"))
                else:
                    # librdkafka reports "no committed offset" as OFFSET_INVALID (-1001).
                    committed[key] = int(tp.offset) if tp.offset >= 0 else None
            for key in keys:
                out.setdefault(key, GroupFacts(committed.get(key)))
        return out

    def _groups(self, keys: list[GroupPartitionKey]) -> dict[GroupPartitionKey, GroupFacts]:
        return self._finish_groups(self._start_groups(keys))

    # -- everything at once (the change feed) ---------------------------------------------------

    def facts(
        self,
        partitions: Iterable[TopicPartitionKey] = (),
        topics: Iterable[TopicKey] = (),
        groups: Iterable[GroupPartitionKey] = (),
        *,
        log_start_for: Iterable[TopicPartitionKey] | None = None,
        refresh_metadata: bool = True,
    ) -> ClusterFacts:
        """Facts for every key: one request per kind (see the module docstring).

        Group readers of groups not among ``groups`` are closed (see :meth:`retain_groups`).
        ``refresh_metadata=False`` reuses the last DescribeTopics answer (leaders, ISR, partition
        counts) when every topic has one, so the poll is a single ListOffsets round trip.
        Raises :class:`KafkaUnavailableError` when the cluster does not answer; per-key problems
        are in the returned facts' ``error``.
        """
        partitions = list(dict.fromkeys(partitions))
        # ListOffsets(earliest) only where someone reads log start offsets (None: everywhere).
        wants_start = set(partitions) if log_start_for is None else set(log_start_for)
        topic_keys = list(dict.fromkeys(topics))
        group_keys = list(dict.fromkeys(groups))
        # The feed asks about every watched key: readers of groups not asked about are unwatched.
        self.retain_groups(k.group for k in group_keys)
        # Group requests go to the group coordinator and do not depend on DescribeTopics: start first.
        started_groups = self._start_groups(group_keys) if group_keys else {}
        names = {k.topic for k in partitions} | {k.topic for k in topic_keys}
        cached = self._descriptions
        reuse = not refresh_metadata and all(isinstance(cached.get(n), _TopicDescription) for n in names)
        describing = {} if reuse else self._start_describe(names)
        counts = self._partition_counts
        early = [k for k in partitions if counts.get(k.topic, 0) > k.partition]
        early_latest = self._list_offsets(early, _LATEST, "ListOffsets(latest)")
        early_earliest = self._list_offsets(
            [k for k in early if k in wants_start], _EARLIEST, "ListOffsets(earliest)"
        )
        described = {n: cached[n] for n in names} if reuse else self._finish_describe(describing)
        min_isr = self.min_insync_replicas(
            t for t in {k.topic for k in partitions} if isinstance(described.get(t), _TopicDescription)
        ) if partitions else {}  # fmt: skip

        valid: list[TopicPartitionKey] = []
        part_errors: dict[TopicPartitionKey, ErrorFact] = {}
        for key in partitions:
            d = described[key.topic]
            if isinstance(d, ErrorFact):
                part_errors[key] = d
            elif key.partition >= len(d.leaders):
                part_errors[key] = ErrorFact(
                    "unknown_topic",
                    f"partition {key.partition} of topic {key.topic!r} does not exist "
                    f"(the topic has {len(d.leaders)} partitions)",
                    key.topic,
                    key.partition,
                )
            else:
                valid.append(key)
        # Partitions first seen now (new keys, new topics): a second round, once per key.
        early_set = set(early)
        late = [k for k in valid if k not in early_set]
        late_latest = self._list_offsets(late, _LATEST, "ListOffsets(latest)")
        late_earliest = self._list_offsets(
            [k for k in late if k in wants_start], _EARLIEST, "ListOffsets(earliest)"
        )
        hw: dict[TopicPartitionKey, ListedOffset | ErrorFact] = {}
        ls: dict[TopicPartitionKey, ListedOffset | ErrorFact] = {}
        for future, into in (
            (early_latest, hw),
            (late_latest, hw),
            (early_earliest, ls),
            (late_earliest, ls),
        ):
            if future is not None:
                into.update(future.collect())

        out_partitions: dict[TopicPartitionKey, PartitionFacts] = {}
        for key in partitions:
            if key in part_errors:
                out_partitions[key] = PartitionFacts(error=part_errors[key])
                continue
            d = described[key.topic]
            assert isinstance(d, _TopicDescription), f"{key} passed validation, so its topic was described"
            high, start = hw.get(key), ls.get(key)
            error = next((v for v in (high, start) if isinstance(v, ErrorFact)), None)
            if error is not None and error.kind == "unknown_topic":
                # DescribeTopics just said this partition exists: "no leader found" means the
                # partition is leaderless for now (a broker is down), not that it is unknown.
                error = ErrorFact("unavailable", f"partition {key.label} has no leader: {error.message}")
            out_partitions[key] = PartitionFacts(
                # A negative offset is librdkafka's "no offset": not known (yet), like no answer.
                high_watermark=high.offset if isinstance(high, ListedOffset) and high.offset >= 0 else None,
                log_start_offset=start.offset
                if isinstance(start, ListedOffset) and start.offset >= 0
                else None,
                leader=d.leaders[key.partition],
                leader_epoch=high.leader_epoch if isinstance(high, ListedOffset) else None,
                isr=d.isr[key.partition],
                replicas=d.replicas[key.partition],
                min_insync_replicas=min_isr.get(key.topic),
                error=error,
            )
        out_topics = {}
        for tkey in topic_keys:
            d = described[tkey.topic]
            out_topics[tkey] = TopicFacts(error=d) if isinstance(d, ErrorFact) else TopicFacts(d.leaders)
        out_groups = self._finish_groups(started_groups) if started_groups else {}
        return ClusterFacts(out_partitions, out_topics, out_groups)
