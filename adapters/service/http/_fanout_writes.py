"""FanoutWrites: one answer written to thousands of sockets, the ``send`` calls shared among threads.

Why: a burst of 10,000 HTTP/1.1 answers (or one event to 10,000 streams) is 10,000 ``send`` calls,
one per socket, and on loopback each costs ~11 µs of kernel time — the sender's TCP output and
the receiver's TCP input both run in the sending thread, and waking the reader is 15% of it
(``perf``, ``purgatory bench fanout``). That was 70% of the loop's time in a burst, and every
later waiter waited for it: the burst's p99 is the loop's time per answer times the burst. The
sockets are independent, the kernel work on one does not touch another, and ``os.write`` lets go
of the GIL: split across threads, the sends run on every core (10,000 answers, 2 cores: p99
127 ms against 160 ms from the loop's thread alone).

How: :meth:`FanoutWrites.write` takes the (transport, bytes) pairs of one loop callback. A plain
TCP transport of asyncio's selector loop with nothing buffered is written directly, by its file
descriptor: the pairs are cut into one share per thread, the loop's thread writes its own share
while :data:`SEND_THREADS` - 1 helper threads write theirs, and the loop's thread waits for them
(it would have spent that time writing them itself). What a socket did not take at once — part
of the bytes (a full socket buffer), or an error (a client gone) — is handed to
``transport.write`` afterwards, on the loop's thread: asyncio buffers the rest, or closes the
connection for the error, exactly as if it had written the whole itself. Any other transport
(TLS, another loop's, one with bytes still buffered) is written through ``transport.write``.

Why this is safe: the loop's thread is inside this call for the whole of it, so nothing else
touches these transports meanwhile — no other write can interleave (a parked connection has no
other writer, and a transport with buffered bytes is not written directly), no close can free a
descriptor a helper is writing.

Closing, likewise (:meth:`FanoutWrites.close_later`). A client that closes its connection after
the answer (h2load, ``curl``, a script without a session) costs the service a ``close`` per
connection, whose kernel part (the FIN, and on loopback the peer's input) was a third of the
loop's time in such a burst, ~15 µs each, taken between the burst's slices. A connection being
lost hands its socket's descriptor to a closer thread instead: asyncio has already removed it
from the selector, and the socket object gives it up (``detach``), so the transport's own close
does nothing and nothing else refers to the number until the closer has closed it.

Concurrency contract: :meth:`write` and :meth:`close_later` on the event loop's thread only; the
helpers touch nothing but the descriptors and bytes handed to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from purgatory._accel import PURE_ENV

__all__ = [
    "CHUNK_WRITES",
    "MIN_SHARED_WRITES",
    "NATIVE_SEND_SHARE",
    "SEND_THREADS",
    "FanoutWrites",
    "fanout_writes",
    "send_share",
]


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


# Threads sending a burst's answers, the loop's own included: one per usable core, at most 4
# (past that the loop's own Python is the bound, not the sends).
SEND_THREADS = max(1, min(4, _usable_cpus()))
# Fewer writes than this are made on the loop's thread alone: handing a share to a helper and
# waiting for it costs about as much as a few dozen sends.
MIN_SHARED_WRITES = 32
# Writes prepared and handed out at a time: the first ones go out while later ones are prepared
# (10,000 event-stream writes prepared in one go held the first for ~30 ms).
CHUNK_WRITES = 512
# The loop's thread's part of an equal share. It also prepares every write, but not while the
# shares are sent: with the C sender (the GIL released for a whole share) an equal share finishes
# with the helpers' (event streams, 10,000: p99 92-98 ms against 90-115 at 0.8).
LOOP_SHARE = 1.0


def _plain_transport_type() -> type | None:
    """asyncio's TCP transport class of the selector loop, whose socket may be written directly."""
    import asyncio.selector_events as selector_events

    # Private to asyncio (3.11-3.13 alike); absent, every write goes through transport.write.
    plain = getattr(selector_events, "_SelectorSocketTransport", None)
    return plain if isinstance(plain, type) else None


_PLAIN = _plain_transport_type()


def _send_share(share: list[tuple[int, bytes]]) -> list[int]:
    """Write each (descriptor, bytes) of ``share``; per pair, how many bytes went (-1: an error)."""
    written: list[int] = []
    write = os.write
    for fd, data in share:
        try:
            written.append(write(fd, data))
        except (BlockingIOError, InterruptedError):
            written.append(0)  # nothing taken: transport.write buffers it all
        except Exception:  # an error (a client gone): nothing written, transport.write meets it again
            written.append(-1)
    return written


def _native_send_share() -> Callable[[list[tuple[int, bytes]]], list[int]] | None:
    """The C share sender (``_send_share.c``: the same results, the whole share without the GIL),
    if the install compiled it."""
    try:
        from ._send_share import send_share as native
    except ImportError:  # no compiler at install (setup.py): the Python share
        return None
    return native


NATIVE_SEND_SHARE = _native_send_share()
# The sender of every share: the C one where built, unless the pure-Python variant is asked for
# (``PURGATORY_PURE``, as for the timer's modules).
send_share: Callable[[list[tuple[int, bytes]]], list[int]] = (
    _send_share
    if NATIVE_SEND_SHARE is None or os.environ.get(PURE_ENV, "") not in ("", "0")
    else NATIVE_SEND_SHARE
)


def _write(transport: asyncio.Transport, data: bytes) -> None:
    """``transport.write``, a failure reported and that connection closed: the others still go."""
    try:
        transport.write(data)
    except Exception as exc:  # e.g. a write after write_eof(): a bug of the caller's, one connection's
        asyncio.get_running_loop().call_exception_handler(
            {"message": "fan-out write failed", "exception": exc, "transport": transport}
        )
        transport.abort()


class FanoutWrites:
    """Many transports' writes at once, shared among the loop's thread and helpers (module docstring)."""

    __slots__ = (
        "__weakref__",
        "_closer",
        "_closing",
        "_helpers",
        "_threads",
        "closed_later",
        "direct",
        "shared",
    )

    def __init__(self, threads: int = SEND_THREADS) -> None:
        self._threads = max(1, threads)
        self._helpers: ThreadPoolExecutor | None = None  # made on the first shared burst
        self._closer: ThreadPoolExecutor | None = None  # made on the first close_later
        self._closing: list[int] = []  # descriptors given up this loop iteration, closed at its end
        self.direct = 0  # writes made by descriptor (tests, and the bench's probes, read them)
        self.shared = 0  # of them, calls whose writes were shared among threads
        self.closed_later = 0  # sockets closed by the closer thread

    def write(self, writes: list[tuple[asyncio.Transport, bytes]]) -> None:
        """Write each pair's bytes to its transport, in full or buffered by it (module docstring).

        Each transport appears at most once per call (shares are written concurrently).
        """
        # (the pairs of a share, its result: the bytes written per pair, or the helper's future)
        shares: list[tuple[list[tuple[asyncio.Transport, bytes]], list[int] | Future[list[int]]]] = []
        try:
            self._hand_out(writes, shares)
        finally:
            # Every share is waited for before this returns, whatever happened meanwhile: once it
            # returns, the loop may close a descriptor that a helper would still be writing.
            for owners, result in shares:
                written = result if isinstance(result, list) else result.result()
                for (transport, data), n in zip(owners, written, strict=True):
                    if n < 0:
                        _write(transport, data)  # meets the error again: asyncio closes the connection
                    elif n < len(data):
                        _write(transport, data[n:])  # the rest, buffered by asyncio until writable

    def _hand_out(
        self,
        writes: list[tuple[asyncio.Transport, bytes]],
        shares: list[tuple[list[tuple[asyncio.Transport, bytes]], list[int] | Future[list[int]]]],
    ) -> None:
        threads = self._threads
        for start in range(0, len(writes), CHUNK_WRITES):
            direct: list[tuple[int, bytes]] = []
            owners: list[tuple[asyncio.Transport, bytes]] = []
            for transport, data in writes[start : start + CHUNK_WRITES]:
                if (
                    type(transport) is _PLAIN
                    and not transport.get_write_buffer_size()
                    and not transport.is_closing()
                ):
                    # The descriptor of asyncio's own socket transport (the class is checked).
                    direct.append((transport._sock_fd, data))  # type: ignore[attr-defined]
                    owners.append((transport, data))
                else:
                    _write(transport, data)
            if not direct:
                continue
            self.direct += len(direct)
            helpers = self._helpers_for(len(direct))
            if helpers is None:
                shares.append((owners, send_share(direct)))
                continue
            self.shared += 1
            # The loop's thread takes LOOP_SHARE of an equal share, the helpers the rest.
            own = max(1, int(len(direct) / threads * LOOP_SHARE))
            size = -(-(len(direct) - own) // (threads - 1))
            for i in range(own, len(direct), size):
                share = direct[i : i + size]
                try:
                    result: list[int] | Future[list[int]] = helpers.submit(send_share, share)
                except RuntimeError:  # the interpreter is shutting down: written here instead
                    result = send_share(share)
                shares.append((owners[i : i + size], result))
            shares.append((owners[:own], send_share(direct[:own])))

    def _helpers_for(self, writes: int) -> ThreadPoolExecutor | None:
        """The helper threads, made on first use; None when ``writes`` are made by the loop alone."""
        if self._threads == 1 or writes < MIN_SHARED_WRITES:
            return None
        helpers = self._helpers
        if helpers is None:
            helpers = self._helpers = ThreadPoolExecutor(
                max_workers=self._threads - 1, thread_name_prefix="purgatory-fanout-send"
            )
        return helpers

    def close_later(self, transport: asyncio.BaseTransport) -> None:
        """From a protocol's ``connection_lost``: its socket is closed by the closer thread, with
        those of every connection lost in the same loop iteration (module docstring). Any
        transport but asyncio's plain TCP one is left to close itself."""
        if self._threads == 1 or type(transport) is not _PLAIN:
            return
        sock = transport._sock  # type: ignore[attr-defined]  # the class is checked
        if sock is None or sock.fileno() < 0 or not transport.is_closing():
            return  # not being closed by asyncio: its reader may still be registered
        closing = self._closing
        closing.append(sock.detach())  # the transport's own close now does nothing
        if len(closing) == 1:
            asyncio.get_running_loop().call_soon(self._close_batch)

    def _close_batch(self) -> None:
        fds, self._closing = self._closing, []
        closer = self._closer
        if closer is None:
            closer = self._closer = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="purgatory-fanout-close"
            )
        self.closed_later += len(fds)
        try:
            closer.submit(_close_all, fds)
        except RuntimeError:  # the interpreter is shutting down: closed here instead
            _close_all(fds)

    def close(self) -> None:
        """Stop the helper threads (a later shared write starts them again)."""
        helpers, self._helpers = self._helpers, None
        if helpers is not None:
            helpers.shutdown(wait=False)
        closer, self._closer = self._closer, None
        if closer is not None:
            closer.shutdown(wait=False)  # a batch already handed over is still closed
        fds, self._closing = self._closing, []
        _close_all(fds)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        # Nothing a peer's state can make fail on a valid descriptor; never stop the rest.
        with contextlib.suppress(OSError):
            os.close(fd)


_writes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FanoutWrites] = weakref.WeakKeyDictionary()


def fanout_writes(loop: asyncio.AbstractEventLoop) -> FanoutWrites:
    """The loop's :class:`FanoutWrites` (made on first use, gone with the loop)."""
    writes = _writes.get(loop)
    if writes is None:
        writes = _writes[loop] = FanoutWrites()
        weakref.finalize(loop, writes.close)
    return writes
