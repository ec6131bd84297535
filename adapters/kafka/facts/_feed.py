"""ChangeFeed: follows the facts of the *watched* keys and wakes the purgatories whose keys changed.

Two sources (docs/design.md §8). **Push** (``kafka.feed_mode = "push"``, the default): a
:class:`PartitionTail` consumer tails every watched partition; the broker's fetch long poll wakes
it when records arrive, and the offset after the last record read is published at once as the
high watermark, while those records' leader epoch is not newer than the facts' (see
``_pushed``) — a key event costs one fetch response and the operations it completes, with no
request per interval. Its records go to ``records`` (the service's shared record cache). The
poll below still runs, every ``feed_refresh_ms`` while every watched key is a tailed healthy
partition (leaders, ISR, log starts, deletions, outages), and every ``interval_ms`` otherwise
(consumer groups — commit barriers keep the batched OffsetFetch —, topics, partitions not yet
tailed, degraded partitions, outages). **Poll** (``"poll"``, the fallback): the poll alone, every
``interval_ms``. Push notices a broker that stopped answering up to ``feed_refresh_ms`` later
than the poll; the long polls' answer bound still holds (tests/service/test_answer_bounds.py
runs both modes) because a read of a stalled partition stalls once, not once per waiter
(:class:`RecordReader`).

The poll (one thread, ``kafka-feed-<name>``), every interval:

1. Take the set of watched keys (a registry of key → reference count per purgatory, kept up to
   date through the purgatory's listener hooks: ``on_submitted`` adds an operation's Kafka keys,
   ``on_finished`` releases them).
2. Ask the :class:`ClusterView` for their facts: at most one batched request per kind of fact
   (ListOffsets latest; ListOffsets earliest for partitions whose operations read log starts;
   one OffsetFetch per group; DescribeTopics every ``metadata_every`` polls, or
   every poll while topics are awaited or a partition is degraded — an error, no leader, or an
   ISR below min.insync.replicas). The number of requests
   depends on the watched keys, never on the pending operations.
3. Publish the new facts as an immutable snapshot (copy-on-write dict swapped in one store:
   operations read it lock-free in ``try_complete``).
4. For each key whose facts changed (including "first seen"), call ``check_and_complete(key)``
   on each purgatory watching it — except when only a partition's high watermark moved and
   every operation of that purgatory on it is indexed by the high watermark it needs
   (``KafkaOperation.indexed_by_high_watermark``: ``DelayedReplication``): then only the ones it
   reached are tried (:class:`OffsetIndex`), so a key event costs what it completes, not every
   waiter on the key. The tail's pushes go the same way.

Worked example: 10,000 ``DelayedReplication`` on 100 partitions → 100 watched keys → 1.2 requests
per interval (ListOffsets latest for the 100 partitions every poll, DescribeTopics for the one
topic every 5th; earliest is polled only for partitions watched by operations with
``needs_log_start``, e.g. DelayedFetch);
a record landing on ``orders-7`` changes that key's high watermark, so of the ~100 operations
watched on ``orders-7`` only the one waiting for that record is tried.

Outages: a request that fails as unavailable is logged and counted, the snapshot keeps its last
facts and records ``unavailable`` (operations quote it when they expire), and polling backs off
exponentially up to ``MAX_BACKOFF_MS``; after ``RECONNECT_AFTER_FAILURES`` failures in a row the
admin client is rebuilt. The feed thread never dies: every failure is caught in the loop. It
never holds a purgatory lock, so a dead cluster cannot wedge a purgatory: operations still expire
and other keys are still served.

Three jobs, a file each: the key registry and the listener hooks (``_feed_keys``, step 1), the
poll thread (here, steps 2-3, and the composition :class:`ChangeFeed`), the waker with its offset
index (``_feed_waker``, step 4, and the tail's pushes); what they share is in ``_feed_state``.

Concurrency contract: ``watch``/``release``/the listener hooks may be called from any thread
(they take the registry lock briefly). ``partition``/``topic``/``group`` read the current
snapshot without locking. ``start``/``stop`` are for the owner's thread.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from types import TracebackType
from typing import Self

import structlog

from ..clients._errors import KafkaUnavailableError
from ..settings import KafkaSettings
from ._facts import NO_LEADER, GroupFacts, PartitionFacts, TopicFacts
from ._feed_keys import _Registration
from ._feed_state import _EMPTY, FeedStats, Purgatoryish, RecordSink, _Observer, _Snapshot
from ._feed_waker import _Waker
from ._keys import GroupPartitionKey, KafkaKey, TopicKey, TopicPartitionKey
from ._offset_index import OffsetIndex
from ._tail import PartitionTail
from ._view import ClusterView

__all__ = ["ChangeFeed", "FeedStats", "Purgatoryish", "RecordSink"]

_log = structlog.get_logger("purgatory.kafka.feed")

MAX_BACKOFF_MS = 1000  # keep probing a dead cluster at least once a second so recovery is quick
RECONNECT_AFTER_FAILURES = 3  # then rebuild the admin client: fresh sockets, fresh metadata
IDLE_WAIT_S = 1.0  # nothing watched: sleep until a key is added (woken at once) or this passes
# Leaders and ISRs change rarely: DescribeTopics every 5th poll (100 ms at the default interval)
# halves the requests and keeps most polls to one round trip. It is sent every poll while a
# TopicKey is watched (topic readiness is read from it) or while some partition has an error.
METADATA_EVERY = 5
WAKE_LIMIT = 4  # at most this many polls per interval when new keys keep waking the feed
JOIN_TIMEOUT_S = 10.0  # a request in flight is bounded by the view's request timeout


class ChangeFeed(_Waker):
    """Polls watched keys' facts and calls ``check_and_complete`` where they changed (see module doc).

    The poll thread is this class; it is the key registry (:class:`_KeyRegistry`) and the waker
    (:class:`_Waker`) by inheritance, and its ``__init__`` sets the state all three share.
    """

    def __init__(
        self,
        view: ClusterView,
        *,
        interval_ms: int | None = None,
        settings: KafkaSettings | None = None,
        name: str = "kafka",
        metadata_every: int = METADATA_EVERY,
        push: bool | None = None,
        records: RecordSink | None = None,
    ) -> None:
        if metadata_every < 1:
            raise ValueError(f"metadata_every must be >= 1, got {metadata_every!r}")
        self.metadata_every = metadata_every
        self.settings = settings or KafkaSettings()
        self.view = view
        self.interval_ms = interval_ms if interval_ms is not None else self.settings.feed_interval_ms
        if self.interval_ms <= 0:
            raise ValueError(f"interval_ms must be > 0, got {self.interval_ms!r}")
        self.name = name
        self.stats = FeedStats()
        self._snapshot = _EMPTY
        self._lock = threading.Lock()
        # key -> {purgatory name -> number of operations watching it there}
        self._refs: dict[KafkaKey, dict[str, int]] = {}
        self._purgatories: dict[str, Purgatoryish] = {}
        # id(op) -> what on_finished must release: purgatory name, Kafka keys, needs_log_start,
        # and its entries in the offset index (key, entry) when its type is indexed.
        self._op_keys: dict[int, _Registration] = {}
        # (purgatory name, partition) -> how many of the operations watching it are indexed by
        # the high watermark they need (OffsetIndex). When that is all of them (_refs), a
        # high-watermark advance of the partition tries only the due ones; otherwise
        # check_and_complete tries them all. Updated with _refs under self._lock, so one read
        # under it sees both counts of the same registrations.
        self._indexed: dict[tuple[str, TopicPartitionKey], int] = {}
        # Operations finished on a thread inside a key event (_check), released together when
        # it ends (_release_finished): one lock and one count update per key for the 10,000
        # long polls one record answers, not one each (on_finished was ~a quarter of the feed
        # thread's samples in that burst, py-spy). Per thread: the tail's and the poll's key
        # events may overlap; a key event nested in another's callbacks joins the outer list.
        self._finishing = threading.local()
        self._one_key_tuples: dict[int, tuple[KafkaKey, ...]] = {}  # see on_submitted
        self.index = OffsetIndex()
        # Partitions whose watchers read the log start offset -> how many such watchers.
        self._log_start_refs: dict[TopicPartitionKey, int] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._observers: list[_Observer] = []
        self._metadata_suspect = True
        # Both the poll loop and the tail publish snapshots: each reads the current one, derives
        # the next and stores it under this lock, so neither overwrites the other's newer facts.
        self._publish_lock = threading.Lock()
        self._records = records
        push = self.settings.feed_mode == "push" if push is None else push
        self.refresh_ms = self.settings.feed_refresh_ms if push else self.interval_ms
        self.tail: PartitionTail | None = None
        bootstrap = getattr(view, "bootstrap_servers", None) or self.settings.bootstrap_servers
        if push and bootstrap:  # no cluster named (a view of tests' own): the polling feed
            self.tail = PartitionTail(
                self.settings,
                bootstrap_servers=bootstrap,
                on_records=self._tailed_records,
                on_high_watermarks=self._pushed,
                on_lost=self._tail_lost,
                name=name,
                # A produce replicated before its partition is tailed is pushed at once, not
                # left to the refresh poll (PartitionTail's module doc, step 1).
                read_last=True,
            )
        else:
            self.refresh_ms = self.interval_ms

    @classmethod
    def from_settings(cls, settings: KafkaSettings, bootstrap_servers: str | None = None) -> ChangeFeed:
        return cls(ClusterView(settings, bootstrap_servers=bootstrap_servers), settings=settings)

    # -- facts (lock-free reads of the current snapshot) ----------------------------------------

    def partition(self, key: TopicPartitionKey) -> PartitionFacts | None:
        return self._snapshot.partitions.get(key)

    def topic(self, key: TopicKey) -> TopicFacts | None:
        return self._snapshot.topics.get(key)

    def group(self, key: GroupPartitionKey) -> GroupFacts | None:
        return self._snapshot.groups.get(key)

    @property
    def unavailable(self) -> str | None:
        """Why the last poll failed, while the cluster is unreachable; None when it answers."""
        return self._snapshot.unavailable

    # -- the loop -------------------------------------------------------------------------------

    def start(self) -> Self:
        if self.tail is not None:
            self.tail.start()
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name=f"kafka-feed-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(JOIN_TIMEOUT_S + self.view.request_timeout_s)
        if self.tail is not None:
            self.tail.stop()

    def is_alive(self) -> bool:
        """True while the feed thread runs (it survives every failure until ``stop``)."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        interval_s = self.interval_ms / 1000.0
        # New keys wake the feed early, but it never polls more than WAKE_LIMIT times per
        # interval: a stream of new keys must not turn into a stream of requests.
        min_gap_s = interval_s / WAKE_LIMIT
        next_poll = last_start = time.monotonic()
        while not self._stopping.is_set():
            wait_s = next_poll - time.monotonic()
            if wait_s > 0 and self._wake.wait(wait_s):
                self._wake.clear()
                too_soon_s = last_start + min_gap_s - time.monotonic()
                if too_soon_s > 0:
                    self._stopping.wait(too_soon_s)
            if self._stopping.is_set():
                return
            self._wake.clear()
            last_start = time.monotonic()
            try:
                polled = self.poll_once()
            except Exception as exc:  # the feed must outlive anything: count, log, back off
                self.stats.failures += 1
                self.stats.consecutive_failures += 1
                self.stats.last_error = repr(exc)
                _log.exception("kafka_feed_poll_failed", feed=self.name)
                polled = True
            if not polled:
                self._wake.wait(IDLE_WAIT_S)
                next_poll = time.monotonic()
                continue
            failures = self.stats.consecutive_failures
            if failures:
                next_poll = time.monotonic() + min(interval_s * 2**failures, MAX_BACKOFF_MS / 1000.0)
            else:
                # Fixed rate: the next poll is one interval after this one was due, not after it ended.
                # Push mode: the slow refresh while the tail pushes every watched key's changes.
                every_s = interval_s if self._needs_fast_poll() else self.refresh_ms / 1000.0
                next_poll = max(next_poll + every_s, time.monotonic())

    def poll_once(self) -> bool:
        """One round: fetch facts of the watched keys, publish, wake changed keys. False if none watched."""
        with self._lock:
            keys = list(self._refs)
            log_start_keys = list(self._log_start_refs)
        if not keys:
            old = self._snapshot
            if old.partitions or old.topics or old.groups:
                self._snapshot = _Snapshot({}, {}, {}, old.unavailable)  # forget unwatched keys' facts
            self.view.retain_groups(())  # close the offset readers of groups no longer watched
            return False
        parts = [k for k in keys if isinstance(k, TopicPartitionKey)]
        topics = [k for k in keys if isinstance(k, TopicKey)]
        groups = [k for k in keys if isinstance(k, GroupPartitionKey)]
        started = time.monotonic()
        self.stats.polls += 1
        try:
            refresh = (
                bool(topics)
                or self._metadata_suspect
                or self.stats.polls % self.metadata_every == 1 % self.metadata_every
            )
            facts = self.view.facts(
                parts, topics, groups, log_start_for=log_start_keys, refresh_metadata=refresh
            )
        except KafkaUnavailableError as exc:
            self._outage(exc)
            return True
        self.stats.last_success = finished = time.monotonic()
        self.stats.poll_ms.append((finished - started) * 1000.0)
        if len(self.stats.poll_ms) > 10_000:
            del self.stats.poll_ms[:5_000]  # bounded history: the benchmark reads recent polls
        if self.stats.consecutive_failures:
            _log.info("kafka_feed_recovered", feed=self.name, after_failures=self.stats.consecutive_failures)
        self.stats.consecutive_failures = 0
        with self._publish_lock:
            old = self._snapshot
            partitions = facts.partitions
            if self.tail is not None:
                partitions = {k: _newest(v, old.partitions.get(k)) for k, v in partitions.items()}
            changed: list[KafkaKey] = []
            changed += [k for k, v in partitions.items() if old.partitions.get(k) != v]
            changed += [k for k, v in facts.topics.items() if old.topics.get(k) != v]
            changed += [k for k, v in facts.groups.items() if old.groups.get(k) != v]
            # One store publishes the whole new snapshot; facts of keys no longer watched are dropped.
            self._snapshot = _Snapshot(partitions, facts.topics, facts.groups, None)
        self.stats.keys_changed += len(changed)
        # Re-describe every poll while a partition is degraded (an error, no leader, ISR below
        # min.insync.replicas): a verdict such as NOT_ENOUGH_REPLICAS must never rest on an ISR
        # older than one interval, and recovery must be seen at once.
        self._metadata_suspect = any(_degraded(f) for f in partitions.values())
        for observer in self._observers:
            observer(changed)
        for key in changed:
            if isinstance(key, TopicPartitionKey):
                self._check(key, _advanced_to(old.partitions.get(key), partitions[key]))
            else:
                self._check(key)
        return True

    def _needs_fast_poll(self) -> bool:
        """True while something is not pushed: poll mode, groups, topics, a key not tailed, trouble."""
        tail = self.tail
        if tail is None or self._metadata_suspect or self.stats.consecutive_failures:
            return True
        with self._lock:
            keys = list(self._refs)
        return not all(isinstance(k, TopicPartitionKey) and tail.following(k) for k in keys)

    def _outage(self, exc: KafkaUnavailableError) -> None:
        self._metadata_suspect = True  # leaders may have moved while the cluster was away
        self.stats.failures += 1
        self.stats.consecutive_failures += 1
        self.stats.last_error = str(exc)
        with self._publish_lock:
            old = self._snapshot
            self._snapshot = _Snapshot(old.partitions, old.topics, old.groups, str(exc))
        if self.stats.consecutive_failures == 1:
            _log.warning("kafka_feed_unavailable", feed=self.name, error=str(exc))
        if self.stats.consecutive_failures % RECONNECT_AFTER_FAILURES == 0:
            self.stats.reconnects += 1
            self.view.reconnect()


def _newest(polled: PartitionFacts, current: PartitionFacts | None) -> PartitionFacts:
    """The polled facts, keeping a newer high watermark the tail pushed since the poll was sent.

    A ListOffsets answer may be older than a fetch response the tail handled meanwhile; high
    watermarks only grow while a partition keeps its leader, so the larger one is the newer. An
    error (deleted, no leader) or a new leader (which may have truncated what the old one had:
    tests/kafka/test_replication.py) always wins: it resets what the tail said. A new leader
    epoch under the same leader does not (the controller bumps it on a reassignment, for one):
    the pushed watermark counts only records the tail read below a high watermark, which every
    in-sync replica has; a poll answer sent before the push must not move it back, or a long
    poll started at the newer watermark is refused as out of range (CI saw that once, in
    tests/service/test_answer_bounds.py with a broker of three killed, while this also reset on
    any epoch change). DelayedReplication still compares epochs itself.
    """
    if (
        current is None
        or polled.leader != current.leader  # a new leader may have truncated: its answer stands
        or polled.error is not None
        or current.error is not None
        or current.high_watermark is None
        or polled.high_watermark is None
        or polled.high_watermark >= current.high_watermark
    ):
        return polled
    return dataclasses.replace(polled, high_watermark=current.high_watermark)


def _advanced_to(old: PartitionFacts | None, new: PartitionFacts) -> int | None:
    """``new``'s high watermark if only that moved forward since ``old`` (log start aside: no
    indexed operation reads it); None for any other change — first facts, leader, epoch, ISR,
    error — which every operation on the key may need to see."""
    high = new.high_watermark
    if old is None or high is None or (old.high_watermark is not None and high <= old.high_watermark):
        return None
    same = dataclasses.replace(old, high_watermark=high, log_start_offset=new.log_start_offset)
    return high if same == new else None


def _degraded(facts: PartitionFacts) -> bool:
    if facts.error is not None or facts.leader == NO_LEADER:
        return True
    return facts.under_min_isr
