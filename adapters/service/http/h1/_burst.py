"""AnswerBurst: the HTTP/1.1 long polls a group's answer releases, written in one tight loop.

Why: a burst of 10,000 answers over HTTP/1.1 is 10,000 ``send`` calls on 10,000 sockets, ~9 µs
of kernel each on loopback — and it was ~20 µs of the loop's time per answer, the rest Python:
each connection found its answer (the shared bytes of its operation), counted it, and re-armed
two timeouts of its own, one answer at a time through five method calls (py-spy, ``purgatory
bench fanout``). While the loop writes, every later waiter waits: the burst's p99 is the loop's
time per answer times the burst.

How: a parked connection whose operation finished joins the loop's burst (:meth:`AnswerBurst.add`,
on the loop, from its group's hand-off) and nothing else happens yet; the burst runs once the
callback that added them returns (``call_soon``, so a group's slice of :data:`ANSWER_SLICE`
waiters is one run), and for each connection:

* the answer's bytes, found once per operation and offset (the same for every waiter of a group),
  with the route's own checks (:meth:`Gateway.fetch_finished`, the shared answer);
* one ``transport.write`` of them;
* the connection back to waiting for its next request: its keep-alive timeout and its next head's
  bound are one :class:`BurstTimeout` each *shared by the whole run* — two loop timers per run,
  not two objects per connection. A connection lets go of its share as it would of its own timer
  (``cancel()`` then dropping it, which uvicorn and :mod:`._head_timeout` already do); the timer
  fires for the connections still holding that very token.

Anything not plain — a connection that closes after its answer, pipelined bytes, the access log
on, an error answer, a body past one write, an offset to check, shutdown — is answered one at a
time by the protocol's own :meth:`LongPollH11Protocol._answer`, as before.

Clients that close after their answer (h2load, ``curl``, a script without a session): each close
is ~25 µs of the loop's time (uvicorn's and asyncio's teardown), and taken between the burst's
slices it doubled a 10,000-answer burst. So an idle connection whose client ends it while a burst
runs (:meth:`AnswerBurst.defer_close`, from ``eof_received``) only stops being read then; it is
closed once an iteration of the loop passes without a run, :data:`CLOSE_SLICE` per iteration (a
new burst pauses them again), and never later than :data:`MAX_LINGER_S` after it was deferred.

Concurrency contract: the event loop's thread only (as uvicorn's protocols).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._fanout_writes import fanout_writes

if TYPE_CHECKING:
    from ._long_poll import LongPollH11Protocol

__all__ = ["AnswerBurst", "BurstTimeout", "answer_burst"]


class BurstTimeout:
    """A timeout shared by the connections of one burst run: each holds this very object.

    ``cancel()`` does nothing: a connection cancels its share by dropping its reference (the
    callers always set the attribute to None, or to another timer, right after cancelling), and
    the burst's loop timer acts only on the connections still holding it.
    """

    __slots__ = ()

    def cancel(self) -> None:
        """One connection's share is let go of by the caller dropping it (class docstring)."""


# Deferred closes (module docstring) made per loop iteration once the burst is over, and the
# longest a close waits for bursts that do not end.
CLOSE_SLICE = 256
MAX_LINGER_S = 0.5


class AnswerBurst:
    """The connections of one loop whose answers are due, written together (module docstring)."""

    __slots__ = (
        "__weakref__",
        "_due",
        "_lingering",
        "_lingering_since",
        "_loop",
        "_ran",
        "_watching",
        "_writes",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: list[LongPollH11Protocol] = []
        self._writes = fanout_writes(loop)
        self._ran = False  # a run since the watch last looked
        self._watching = False  # the watch is scheduled: a burst runs, or deferred closes remain
        self._lingering: list[asyncio.BaseTransport] = []  # ended by their clients, closed after the burst
        self._lingering_since = 0.0

    def defer_close(self, transport: asyncio.BaseTransport) -> bool:
        """From an idle connection's ``eof_received``: True if its close waits for the burst's end
        (the caller then keeps the transport open; asyncio stops reading it), False if no burst
        runs (close it now)."""
        if not self._watching:
            return False
        if not self._lingering:
            self._lingering_since = self._loop.time()
        self._lingering.append(transport)
        return True

    def _watch(self) -> None:
        """Once per loop iteration while bursts run, then while deferred closes remain."""
        ran, self._ran = self._ran, False
        lingering = self._lingering
        if ran and (not lingering or self._loop.time() - self._lingering_since < MAX_LINGER_S):
            self._loop.call_soon(self._watch)  # still running: closes wait
            return
        if len(lingering) > CLOSE_SLICE:
            batch, self._lingering = lingering[:CLOSE_SLICE], lingering[CLOSE_SLICE:]
        else:
            batch, self._lingering = lingering, []
        for transport in batch:
            try:
                transport.close()  # a no-op if it closed meanwhile (a timeout, shutdown)
            except Exception as exc:  # one connection's; the others are still closed
                self._loop.call_exception_handler(
                    {"message": "deferred close failed", "exception": exc, "transport": transport}
                )
        if self._lingering:
            self._loop.call_soon(self._watch)
        else:
            self._watching = False

    def add(self, protocol: LongPollH11Protocol) -> None:
        """``protocol``'s parked long poll is answered in the burst's next run."""
        due = self._due
        if not due:
            self._loop.call_soon(self._run)
        due.append(protocol)

    def _run(self) -> None:
        due, self._due = self._due, []
        self._ran = True
        if not self._watching:
            self._watching = True
            self._loop.call_soon(self._watch)
        # The answer of the last (operation, offset) written: a group's waiters share both, so
        # the route's lookups run once per group, not once per connection.
        last_op: object = None
        last_offset: int | None = None
        data = b""
        # What the run did per server (its ServerState): one server in practice, so the last
        # one is kept at hand and the map is asked only when the server changes.
        servers: dict[int, _Served] = {}
        state: object = None
        served: _Served | None = None
        ref = weakref.ref
        writes: list[tuple[asyncio.Transport, bytes]] = []  # made together once every answer is known
        for protocol in due:
            parked = protocol._parked
            if parked is None:
                continue  # the client left (connection_lost let go of it)
            try:
                if parked.close or parked.target is not None or parked.pipelined or protocol._closing:
                    protocol._answer(parked)  # not plain: one at a time, as the protocol answers
                    continue
                op = parked.op
                if op is not last_op or parked.offset != last_offset:
                    plain = protocol._plain_answer(parked)
                    if plain is None:
                        last_op = None
                        protocol._answer(parked)
                        continue
                    data, last_op, last_offset = plain, op, parked.offset
                transport = protocol.transport
                if transport.is_closing():
                    continue  # the client left: connection_lost lets go of it
                writes.append((transport, data))
                protocol._parked = None
                if protocol.server_state is not state or served is None:
                    state = protocol.server_state
                    served = servers.get(id(state))
                    if served is None:
                        served = servers[id(state)] = _Served(protocol)
                served.count(data)
                # Back to awaiting the next request: the run's shared timeouts (module docstring).
                keep_alive = protocol.timeout_keep_alive_task
                if keep_alive is not None:
                    keep_alive.cancel()
                head = protocol._head_timer
                if head is not None:
                    head.cancel()
                protocol.timeout_keep_alive_task = served.keep_alive  # type: ignore[assignment]
                protocol._head_timer = served.head
                protocol._head_bytes = 0
                served.protocols.append(ref(protocol))
                if protocol.flow.read_paused:
                    protocol.flow.resume_reading()
            except Exception as exc:
                # A bug in one connection's answer: the others are still answered; this one is
                # closed rather than left with nobody to answer it.
                self._loop.call_exception_handler(
                    {"message": "long-poll answer failed", "exception": exc, "protocol": protocol}
                )
                protocol.transport.close()
        try:
            self._writes.write(writes)
        finally:
            for each in servers.values():
                each.done(self._loop)  # the answered connections' shared timeouts, whatever happened


class _Served:
    """One server's share of a burst run: its answers counted, its connections' shared timeouts."""

    __slots__ = ("counts", "head", "head_s", "keep_alive", "keep_alive_s", "protocols", "route", "state")

    def __init__(self, protocol: LongPollH11Protocol) -> None:
        self.state = protocol.server_state
        self.route = protocol._route
        self.keep_alive_s = float(protocol.timeout_keep_alive)
        self.head_s = protocol.head_timeout_s
        self.keep_alive = BurstTimeout()
        self.head = BurstTimeout()
        self.protocols: list[weakref.ref[LongPollH11Protocol]] = []
        self.counts: list[list[Any]] = []  # [data, n]: answers written as these bytes

    def count(self, data: bytes) -> None:
        counts = self.counts
        if counts and counts[-1][0] is data:
            counts[-1][1] += 1
        else:
            counts.append([data, 1])

    def done(self, loop: asyncio.AbstractEventLoop) -> None:
        """The run is over: count its answers, arm its two shared timeouts."""
        for data, n in self.counts:
            self.state.total_requests += n
            if self.route is not None:
                self.route.count_http11(data, n)
        if self.protocols:
            loop.call_later(self.keep_alive_s, _expire, self.protocols, self.keep_alive, _keep_alive_expired)
            loop.call_later(self.head_s, _expire, self.protocols, self.head, _head_timed_out)


def _keep_alive_expired(protocol: LongPollH11Protocol, token: BurstTimeout) -> None:
    held: object = protocol.timeout_keep_alive_task  # uvicorn types it a TimerHandle
    if held is token:
        protocol.timeout_keep_alive_task = None
        protocol._keep_alive_expired()


def _head_timed_out(protocol: LongPollH11Protocol, token: BurstTimeout) -> None:
    if protocol._head_timer is token:
        protocol._head_timed_out()


def _expire(
    protocols: list[weakref.ref[Any]],
    token: BurstTimeout,
    expired: Callable[[LongPollH11Protocol, BurstTimeout], None],
) -> None:
    """A burst run's shared timeout, for each connection still holding ``token``."""
    for ref in protocols:
        protocol = ref()
        if protocol is None:
            continue
        try:
            expired(protocol, token)
        except Exception as exc:  # as the loop does for a timer's callback; the rest still run
            protocol.loop.call_exception_handler(
                {"message": "long-poll idle timeout failed", "exception": exc, "protocol": protocol}
            )


_bursts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AnswerBurst] = weakref.WeakKeyDictionary()
# The last loop looked up and its burst, both weakly: one loop answers every burst of a server.
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[AnswerBurst]] | None = None


def answer_burst(loop: asyncio.AbstractEventLoop) -> AnswerBurst:
    """The loop's burst (made on first use, gone with the loop)."""
    global _last
    last = _last
    if last is not None and last[0]() is loop:
        burst = last[1]()
        if burst is not None:
            return burst
    burst = _bursts.get(loop)
    if burst is None:
        burst = _bursts[loop] = AnswerBurst(loop)
    _last = (weakref.ref(loop), weakref.ref(burst))
    return burst
