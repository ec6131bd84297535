"""The lifecycle of a :class:`KafkaPurgatory`: stop (drain), close, and draining on signals.

``stop`` answers every pending operation at once (``SHUTTING_DOWN``; produces in flight first get
``SHUTDOWN_FLUSH_S`` for their delivery reports); ``close`` then closes the clients;
``drain_on_signals`` starts the drain when SIGTERM/SIGINT arrives (before a server's graceful
shutdown waits for the purgatory's waits in full) and chains to the handler it replaced.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Self

from purgatory import DelayedOperationPurgatory
from purgatory.journal import Journal

from .._metrics import untrack_feed
from ..clients._calls import KafkaCalls
from ..clients._clients import RecordReader
from ..clients._sender import RecordSender
from ..facts._feed import ChangeFeed
from ..facts._view import ClusterView
from ..ops._operations import draining
from ..ops._produce import DelayedProduce
from ..reply._reply_router import ReplyRouter
from ._defaults import DRAIN_SIGNALS, PURGATORY_NAMES, SHUTDOWN_FLUSH_S, _SignalHandler

if TYPE_CHECKING:
    from ._async import AsyncKafkaPurgatory

__all__: list[str] = []


class _Lifecycle:
    """Stop, close and signal draining (a base of :class:`KafkaPurgatory`, which sets the state)."""

    _clients_closed: bool
    _close_done: bool
    _closed: bool
    _lock: threading.Lock
    _purgatories: dict[str, DelayedOperationPurgatory[Any]]
    _redeliver: int | None
    _router: ReplyRouter | None
    _shared: DelayedOperationPurgatory[Any] | None
    _signal_handlers: dict[int, tuple[Callable[[int, FrameType | None], None], _SignalHandler]]
    _stopped: threading.Event
    _stopper: threading.Thread | None
    aio: AsyncKafkaPurgatory
    calls: KafkaCalls
    feed: ChangeFeed
    journal: Journal | None
    name: str
    reader: RecordReader
    sender: RecordSender
    view: ClusterView

    def stop(self, *, drain: bool = True) -> None:
        """Answer every pending operation now, then stop the feed; the clients stay open.

        ``drain``: every operation still held finishes at once (``EXPIRED``, its undecided
        partitions ``SHUTTING_DOWN``; none is lost, nobody hangs), produces already sent after
        at most ``SHUTDOWN_FLUSH_S`` of delivery reports; ``drain=False`` is Kafka's behaviour:
        they are left unexecuted. Operations submitted from now until :meth:`close` returns are
        answered ``SHUTTING_DOWN``. :meth:`close` starts with this; an owner with workers of its
        own that may still read through the clients (the HTTP service's fetch attempts) calls it
        first, waits for them, then calls :meth:`close`. Blocks while operations drain (well
        under a second; a second caller waits for the first). Idempotent.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
            purgatories = list(self._purgatories.values())
        if not first:
            # Another thread drains (begin_shutdown): close() must not close the clients under it.
            self._stopped.wait()
            return
        try:
            produce_name = PURGATORY_NAMES[DelayedProduce]
            ordered = sorted(purgatories, key=lambda p: p.name == produce_name)  # produce last
            for purgatory in ordered:
                self.feed.detach(purgatory)
                if purgatory is self._shared:
                    continue
                if drain and purgatory.name == produce_name and purgatory.num_delayed():
                    # Reports served by the flush complete the produces they finish, as delivered.
                    self.sender.flush(SHUTDOWN_FLUSH_S)
                with draining():  # drained here, on this thread: answered SHUTTING_DOWN
                    purgatory.shutdown(drain=drain)
            # Only now: the feed's thread may be inside a Kafka request for up to the request
            # timeout, and the callers must not wait for it to be answered.
            self.feed.stop()
        finally:
            self._stopped.set()

    def begin_shutdown(self) -> None:
        """Start :meth:`stop` on a thread of its own and return at once; idempotent.

        What :meth:`drain_on_signals` calls when the signal comes: the waiting callers are
        answered ``SHUTTING_DOWN`` while the server is still finishing its requests.
        """
        with self._lock:
            if self._closed or self._stopper is not None:
                return
            self._stopper = threading.Thread(
                target=self._stop_then_redeliver, name=f"purgatory-{self.name}-stop"
            )
        self._stopper.start()

    def _stop_then_redeliver(self) -> None:
        self.stop()
        signum = self._redeliver
        if signum is not None:
            os.kill(os.getpid(), signum)  # its default action, restored by the handler: after the drain

    def drain_on_signals(self, signals: Iterable[int] = DRAIN_SIGNALS) -> bool:
        """On each of ``signals`` start the drain (:meth:`begin_shutdown`), then run the handler
        that was installed before (uvicorn's, which begins its graceful shutdown).

        Call it from the main thread once the server runs — in a FastAPI lifespan, after
        ``connect()`` — so it chains to the server's handlers. Why: uvicorn waits for the
        in-flight requests before it runs the lifespan's shutdown, so without this the callers
        waiting in the purgatory are answered only at their own timeout (or cancelled, a 500,
        past ``--timeout-graceful-shutdown``). With it they get ``SHUTTING_DOWN`` within a second
        of the signal. A signal whose handler was the default one (no server) is delivered again
        with its default action once the drain is over. :meth:`close` puts the handlers back
        (when called on the main thread; ``aclose`` is).

        Returns False, installing nothing, off the main thread, where Python delivers no signal
        (an application run by a test client's thread): the lifespan code stays the same there.
        """
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for signum in signals:
            previous: _SignalHandler = signal.getsignal(signum)
            handler = self._signal_handler(loop, previous)
            signal.signal(signum, handler)
            self._signal_handlers[signum] = (handler, previous)
        return True

    def _signal_handler(
        self, loop: asyncio.AbstractEventLoop | None, previous: _SignalHandler
    ) -> Callable[[int, FrameType | None], None]:
        def handler(signum: int, frame: FrameType | None) -> None:
            # Runs on the main thread between two bytecodes, possibly while that thread holds one
            # of our locks: it only hands the work over. call_soon_threadsafe is safe here (it
            # appends and writes the loop's self-pipe); without a loop, a thread start is.
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self.begin_shutdown)
            else:
                self.begin_shutdown()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                self._redeliver = signum

        return handler

    def _restore_signals(self) -> None:
        # Python lets only the main thread change handlers; close() off it leaves them (harmless:
        # a handler of a closed purgatory only chains to the previous one).
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, (handler, previous) in list(self._signal_handlers.items()):
            if signal.getsignal(signum) is handler:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._signal_handlers[signum]

    def close(self) -> None:
        """Answer the pending operations (:meth:`stop`), flush the journal, close the clients.

        Every operation still held is answered within a second (``SHUTTING_DOWN``; none is lost);
        from asyncio use :meth:`aclose`. Idempotent.
        """
        self._restore_signals()
        self.stop()
        with self._lock:
            if self._clients_closed:
                return
            self._clients_closed = True
        try:
            if self._router is not None:  # after the drain: waiting requests expired, none is lost
                self._router.close()
            if self.journal is not None:
                self.journal.close()
            self.calls.close()
            self.sender.close()
            self.reader.close()
            self.view.close()
        finally:
            untrack_feed(self)
            self._close_done = True

    async def aclose(self) -> None:
        """:meth:`close` in the default executor: the event loop keeps serving while it drains."""
        self._restore_signals()  # on the loop's thread: the main one, where Python allows it
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _prepare_journal(self) -> None:
        if self.journal is None:
            return
        try:
            self.journal.prepare()  # a journal that cannot write fails here, not once per event
        except BaseException:
            self.close()  # the feed thread and clients must not outlive the failed start
            raise

    def __enter__(self) -> Self:
        self._prepare_journal()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> AsyncKafkaPurgatory:
        # Checking (or creating) the journal topic is a Kafka round trip: off the loop.
        await asyncio.get_running_loop().run_in_executor(None, self._prepare_journal)
        return self.aio

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
