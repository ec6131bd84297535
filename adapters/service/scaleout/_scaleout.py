"""Scale-out of the example service: which instance serves a partition, and what the others answer.

With ``scaleout.enabled`` every instance joins the ownership group (:class:`PartitionOwnership`)
and serves only the partitions it owns (docs/design.md §7). A request for a partition owned elsewhere is
answered ``307`` to the owner (``scaleout.mode = "redirect"``, with ``Retry-After`` while the
assignment moves) or forwarded to it (``"forward"``: a bounded connection pool, its own
timeouts; a forwarded request is never forwarded again). No owner yet: ``503`` + ``Retry-After``.

An operation whose partition is revoked while it waits finishes at once as MOVED
(:class:`OwnershipGuard`); the answer says where to retry: a long poll gets ``307`` to the new
owner with the same offset and what remains of its ``max_wait_ms``; a replication wait
(``GET /topics/{t}/replicated``) gets ``307`` to the same wait at the new owner. While the new
owner is not known yet: ``503`` + ``Retry-After`` and a relative ``Location`` any instance answers.

Only members that proved they are instances (``scaleout.secret`` / ``scaleout.trusted_urls``,
:class:`OwnerProof`) are redirected or forwarded to; a partition held
by any other member is served here (docs/guide/scale-out.md).

A produce does not depend on ownership: any instance produces to any partition (the idempotent
producer's ``acks=all`` is answered by the partition's leader, wherever the request came in).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urlencode

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from purgatory import DelayedOperationPurgatory
from purgatory.settings import Settings

from ...kafka import (
    DIGEST_BYTES,
    DelayedFetch,
    DelayedReplication,
    KafkaOperation,
    OwnedOperation,
    Owner,
    OwnershipGuard,
    OwnerStatus,
    PartitionOwnership,
    RecordIdentity,
    TopicPartitionKey,
    WatchedKeys,
)
from ...kafka.ops._owned import OwnedFetch, OwnedReplication
from ..answers._errors import RequestError
from ..app._requests import MAX_OFFSET, MAX_PARTITION
from ._redirect import Redirect, redirect_for

__all__ = ["FORWARDED_HEADER", "OwnedFetch", "OwnedReplication", "ScaleOut", "ScaleOutCollector"]

# Set on a forwarded request: its receiver answers (serves, redirects or 503s) but never forwards
# again, so two instances with different views of the group cannot bounce a request forever.
FORWARDED_HEADER = "x-purgatory-forwarded-by"
# ASCII digits only, as many as the largest legal value has: str.isdigit() also accepts
# superscript two (int() then fails: a 500) and Arabic-Indic three (int() reads it as 3).
# A partition is written one way only, without leading zeros: "00" and "0" naming one partition
# are two spellings of the same key for everything that compares the text (caches, routing).
_CANONICAL_PARTITION = r"(0|[1-9][0-9]{0,9})"
_PARTITION_NUMBER = re.compile(rf"{_CANONICAL_PARTITION}:([0-9]{{1,19}})")
_RECORD_IDENTITY = re.compile(
    rf"{_CANONICAL_PARTITION}:([0-9]{{1,19}}):(-1|[0-9]{{1,19}}):([0-9a-fA-F]{{{DIGEST_BYTES * 2}}})"
)
FORWARD_CONNECT_TIMEOUT_S = 2.0  # an owner that does not accept a connection in 2 s is not serving
_RELAYED_HEADERS = ("content-type", "location", "retry-after")  # from the owner's answer
_FORWARDED_REQUEST_HEADERS = ("content-type", "authorization")  # from the client's request


def _answer(redirect: Redirect) -> Response:
    return JSONResponse(redirect.body, status_code=redirect.status, headers=redirect.headers)


class ScaleOut:
    """The ownership group, the guard of the gateway's purgatories, and the misdirected-request answers."""

    def __init__(
        self,
        settings: Settings,
        bootstrap_servers: str,
        purgatories: Sequence[DelayedOperationPurgatory[Any]],
        watched: WatchedKeys,
    ) -> None:
        self.settings = settings.scaleout
        self.ownership = PartitionOwnership(
            settings.kafka, settings.scaleout, bootstrap_servers=bootstrap_servers
        )
        self.guard = OwnershipGuard(self.ownership, purgatories, watched)
        self.misdirected: Counter[str] = Counter()  # answers to requests for others' partitions
        self._forwarder: httpx.AsyncClient | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return self.ownership.url

    def start(self) -> None:
        self.ownership.start()

    def close(self) -> None:
        """Leave the group: owned partitions are revoked and their waiting operations answered MOVED."""
        if self._closed:
            return
        self._closed = True
        self.ownership.close("shutdown")
        self.guard.close()

    async def aclose(self) -> None:
        if self._forwarder is not None:
            await self._forwarder.aclose()

    def place(self, op: KafkaOperation) -> None:
        """Make ``op`` move when its partitions do (before it is submitted)."""
        if isinstance(op, OwnedOperation):
            op.placement = self.guard.placement(op.watch_keys())

    # -- where a request belongs ----------------------------------------------------------------

    def owner_of(self, topic: str, partitions: Iterable[int]) -> Owner | RequestError:
        """The one owner of ``partitions`` of ``topic``, or a 409 when they span several owners."""
        owners = {self.ownership.owner(TopicPartitionKey(topic, p)) for p in partitions}
        here = {o for o in owners if o.served_here}
        if here == owners:
            return next(iter(owners), Owner(OwnerStatus.UNMANAGED, self.url))
        if any(o.status is OwnerStatus.NONE for o in owners):
            return Owner(OwnerStatus.NONE, None, moving=True, generation=self.ownership.generation)
        urls = {o.url for o in owners if o.status is OwnerStatus.OTHER}
        if here or len(urls) > 1:
            return RequestError(
                409,
                "PARTITIONS_SPAN_OWNERS",
                "records",
                f"the partitions of this request are served by {len(urls) + bool(here)} instances; "
                "send one request per owner (GET /owners shows the assignment)",
            )
        return next(o for o in owners if o.status is OwnerStatus.OTHER)

    async def elsewhere(
        self, request: Request, topic: str, partitions: Iterable[int], body: bytes | None = None
    ) -> Response | None:
        """None if this instance serves ``partitions``; else the 307/503/forwarded answer."""
        owner = self.owner_of(topic, partitions)
        if isinstance(owner, RequestError):
            self.misdirected["span"] += 1
            raise owner
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        redirect = redirect_for(owner, path, retry_after_s=self.settings.retry_after_s)
        if redirect is None:
            return None
        if (
            redirect.status == 307
            and self.settings.mode == "forward"
            and owner.url
            and FORWARDED_HEADER not in request.headers
        ):
            self.misdirected["forward"] += 1
            return await self._forward(request, owner.url + path, body)
        self.misdirected["redirect" if redirect.status == 307 else "unavailable"] += 1
        return _answer(redirect)

    async def _forward(self, request: Request, url: str, body: bytes | None) -> Response:
        if self._forwarder is None:
            pool = self.settings.forward_max_connections
            self._forwarder = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
                timeout=httpx.Timeout(
                    self.settings.forward_timeout_ms / 1000.0, connect=FORWARD_CONNECT_TIMEOUT_S
                ),
                follow_redirects=False,
            )
        headers = {FORWARDED_HEADER: self.url}
        # The client's credentials go along: the owner authenticates the request itself (the
        # instances share service.auth_tokens), so a forward grants nothing a redirect would not.
        # ``url`` is a verified owner's (owner_of answers OTHER only for a member whose proof
        # verified): an unproven member never receives a request, let alone a token. Cookies
        # are not forwarded (the service does not use them).
        for name in _FORWARDED_REQUEST_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        try:
            answer = await self._forwarder.request(request.method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self.misdirected["forward_failed"] += 1
            retry = {"Retry-After": str(self.settings.retry_after_s)}
            failed = RequestError(
                503, "FORWARD_FAILED", None, f"the partition's owner did not answer: {exc!r}"
            )
            return JSONResponse(failed.body(), status_code=503, headers=retry)
        relayed = {k: v for k, v in answer.headers.items() if k.lower() in _RELAYED_HEADERS}
        return Response(answer.content, status_code=answer.status_code, headers=relayed)

    # -- MOVED answers --------------------------------------------------------------------------

    def _current_owner_url(self, key: TopicPartitionKey, known: str | None) -> str | None:
        if known:
            return known
        owner = self.ownership.owner(key)
        return owner.url if owner.status is OwnerStatus.OTHER else None

    def _moved(self, key: TopicPartitionKey, known: str | None, path: str, *, status: int) -> Response:
        url = self._current_owner_url(key, known)
        moved = {"outcome": "MOVED", "owner": url, "generation": self.ownership.generation}
        if url:
            return JSONResponse(moved, status_code=status, headers={"Location": url.rstrip("/") + path})
        headers = {"Retry-After": str(self.settings.retry_after_s), "Location": path}
        return JSONResponse(moved, status_code=503, headers=headers)

    def moved_fetch(
        self, request: Request, op: DelayedFetch, started: float, default_wait_ms: int
    ) -> Response:
        """307 to the new owner: the same long poll from the same offset, for what remains of its wait."""
        ((key, offset),) = op.fetch_offsets.items()
        query = dict(request.query_params)
        waited_ms = int((time.monotonic() - started) * 1000)
        query["offset"] = str(offset)
        query["max_wait_ms"] = str(max(0, int(query.get("max_wait_ms", default_wait_ms)) - waited_ms))
        assert op.moved is not None
        return self._moved(key, op.moved.owner_url, f"{request.url.path}?{urlencode(query)}", status=307)

    def moved_replication(
        self, topic: str, op: DelayedReplication, started: float, timeout_ms: int
    ) -> Response | None:
        """307 to the new owner's replication wait for the same offsets; None when the wait's
        fence cannot go there (:func:`replicated_query`): answer ``op`` itself."""
        remaining = max(0, timeout_ms - int((time.monotonic() - started) * 1000))
        query = replicated_query(op, remaining)
        if query is None:
            return None
        path = f"/topics/{topic}/replicated?{urlencode(query)}"
        assert op.moved is not None
        return self._moved(next(iter(op.appended)), op.moved.owner_url, path, status=307)

    def owners_json(self) -> dict[str, Any]:
        described = self.ownership.describe()
        return {"enabled": True, "mode": self.settings.mode, **described}


def replicated_query(op: DelayedReplication, timeout_ms: int) -> dict[str, str] | None:
    """The query of ``GET /topics/{t}/replicated`` that continues ``op``'s wait elsewhere; None
    when ``op``'s fence cannot go with it.

    A wait given leader epochs (``op.fenced``) travels with every partition's epoch, and its
    record identities when it reads them back. Should one partition lack either, a query
    without them would wait on bare offsets at the new owner — no fence for *any* partition, a
    lost record answered NONE — so there is none: the caller answers ``op`` as it stands (503
    NOT_LEADER_OR_FOLLOWER). Plain targets (``offsets`` alone, epochs adopted when first seen)
    travel as they came: epochs only when every partition has adopted one.
    """
    ordered = sorted(op.appended.items(), key=lambda item: item[0].partition)
    query = {"offsets": ",".join(f"{k.partition}:{o}" for k, o in ordered), "timeout_ms": str(timeout_ms)}
    epochs = {k: op.leader_epochs.get(k) for k, _ in ordered}
    reads_back = bool(op.read_back)
    if op.fenced and (
        any(e is None for e in epochs.values()) or (reads_back and any(k not in op.read_back for k in epochs))
    ):
        return None
    if all(e is not None for e in epochs.values()):
        # The leader epochs before the append travel along: the new owner keeps the fence
        # (a leader change since the append is still NOT_LEADER_OR_FOLLOWER there).
        query["epochs"] = ",".join(f"{k.partition}:{e}" for k, e in epochs.items())
        if reads_back:
            # And what the appended records are: the new owner reads them back before NONE too
            # (a deposed leader's acks=1 append, see DelayedReplication).
            query["records"] = ",".join(
                f"{k.partition}:{r.offset}:{r.timestamp_ms}:{r.digest.hex()}"
                for k, _ in ordered
                for r in op.read_back[k]
            )
    return query


def parse_record_identities(raw: str) -> dict[int, tuple[RecordIdentity, ...]]:
    """``"0:41:1700000000000:<32 hex>,..."`` (partition:offset:timestamp:digest) → identities per
    partition, or a 400 naming ``records``."""
    out: dict[int, tuple[RecordIdentity, ...]] = {}
    for item in raw.split(","):
        match = _RECORD_IDENTITY.fullmatch(item)
        if match is None or int(match[1]) > MAX_PARTITION or max(int(match[2]), int(match[3])) > MAX_OFFSET:
            raise RequestError(
                400,
                "INVALID_REQUEST",
                "records",
                f"records must be partition:offset:timestamp:digest[,...] (a digest of "
                f"{DIGEST_BYTES * 2} hex digits, as a MOVED answer names them), got {item!r}",
            )
        partition = int(match[1])
        identity = RecordIdentity(int(match[2]), int(match[3]), bytes.fromhex(match[4]))
        out[partition] = (*out.get(partition, ()), identity)
    return out


def parse_offsets(raw: str | None, field: str = "offsets", limit: int = MAX_OFFSET) -> dict[int, int]:
    """``"0:41,3:17"`` → ``{0: 41, 3: 17}``, or a 400 naming the field.

    Partitions are Kafka's int32, numbers at most ``limit`` (an offset's int64; a leader epoch's
    int32): a larger one would wait its whole timeout for an offset no log can reach. A partition
    named twice is refused rather than one of its numbers silently dropped.
    """
    if not raw:
        raise RequestError(400, "INVALID_REQUEST", field, f"{field} is required: partition:number[,...]")
    out: dict[int, int] = {}
    for item in raw.split(","):
        match = _PARTITION_NUMBER.fullmatch(item)
        if match is None:
            raise RequestError(
                400, "INVALID_REQUEST", field, f"{field} must be partition:number[,...], got {item!r}"
            )
        partition, number = int(match[1]), int(match[2])
        if partition > MAX_PARTITION or number > limit:
            raise RequestError(
                400,
                "INVALID_REQUEST",
                field,
                f"{field}: {item!r} is out of range (partition <= {MAX_PARTITION}, number <= {limit})",
            )
        if partition in out:
            raise RequestError(400, "INVALID_REQUEST", field, f"{field} names partition {partition} twice")
        out[partition] = number
    return out


class ScaleOutCollector(Collector):
    """Ownership metrics: owned partitions, generation, members, rebalances, moved operations."""

    def __init__(self, scaleout: Callable[[], ScaleOut | None]) -> None:
        self._scaleout = scaleout

    def collect(self) -> Iterator[Metric]:
        scaleout = self._scaleout()
        if scaleout is None:
            return
        ownership = scaleout.ownership
        owned = GaugeMetricFamily("purgatory_ownership_partitions_owned", "Partitions this instance owns.")
        owned.add_metric([], len(ownership.owned()))
        generation = GaugeMetricFamily(
            "purgatory_ownership_generation",
            "This member's rebalance generation (count of its rebalance events).",
        )
        generation.add_metric([], ownership.generation)
        members = GaugeMetricFamily(
            "purgatory_ownership_members", "Members of the group at the last describe."
        )
        members.add_metric([], len(ownership.snapshot().members))
        untrusted = GaugeMetricFamily(
            "purgatory_ownership_untrusted_members",
            "Members of the group at the last describe that did not prove they are instances "
            "(their partitions are served here; nothing is sent to them).",
        )
        untrusted.add_metric([], sum(not m.trusted for m in ownership.snapshot().members))
        rebalances = CounterMetricFamily(
            "purgatory_ownership_rebalances", "Rebalance events of this member.", labels=["kind"]
        )
        stats = ownership.stats
        for kind, value in (("assigned", stats.assigned), ("revoked", stats.revoked), ("lost", stats.lost)):
            rebalances.add_metric([kind], value)
        moved = CounterMetricFamily(
            "purgatory_ownership_moved_operations", "Operations answered MOVED when their partition moved."
        )
        moved.add_metric([], scaleout.guard.moved)
        describes = CounterMetricFamily(
            "purgatory_ownership_describes", "DescribeConsumerGroups requests sent."
        )
        describes.add_metric([], stats.describes)
        consumer = CounterMetricFamily(
            "purgatory_ownership_consumer_requests",
            "Requests of the group consumer (heartbeats, joins, metadata).",
        )
        consumer.add_metric([], stats.consumer_requests)
        misdirected = CounterMetricFamily(
            "purgatory_service_misdirected_requests",
            "Requests for partitions owned elsewhere, by answer.",
            labels=["answer"],
        )
        for answer in ("redirect", "forward", "forward_failed", "unavailable", "span"):
            misdirected.add_metric([answer], scaleout.misdirected[answer])
        yield from (
            owned,
            generation,
            members,
            untrusted,
            rebalances,
            moved,
            describes,
            consumer,
            misdirected,
        )


async def release_on_shutdown(scaleout: ScaleOut | None) -> None:
    """Leave the group now (off the loop): called first thing when the server starts shutting down."""
    if scaleout is not None:
        await asyncio.to_thread(scaleout.close)
