"""DelayedOperation: a request that cannot be answered yet, finished exactly once."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

from ._operation_core import LockLike, OperationCore, OperationOwner, Waiter, finish, is_finished
from ._outcome import Outcome

__all__ = ["DelayedOperation", "LockLike", "OperationOwner", "Waiter"]

# Read as a module global by force_complete's wrapper (interpreted: a global load is cached by
# the interpreter; ``Outcome.COMPLETED`` was an attribute lookup on the enum class, ~70 ns of
# every completion: ``purgatory bench purgatory``, issue 15).
_COMPLETED = Outcome.COMPLETED


class DelayedOperation(OperationCore):
    """An operation that finishes when ``try_complete`` succeeds or when ``delay_ms`` passes.

    Subclasses implement:

    * ``try_complete()`` — check the condition; if it holds, call ``force_complete()`` and return
      its result. Called with ``op.lock`` held.
    * ``on_complete()`` — the one place the response is produced. Runs exactly once, however the
      operation finished; ``op.outcome`` says why.
    * ``on_expiration()`` — extra work on timeout; runs after ``on_complete`` for expired ones only.

    Finishing is *claimed* by an atomic test-and-set that is independent of ``op.lock``: exactly
    one of ``force_complete``, expiry (``run``) and cancellation wins; the others get False. So
    ``force_complete`` may be called from anywhere, including inside ``try_complete`` whatever
    lock the operation was given. ``op.lock`` defaults to the operation's own re-entrant lock,
    which behaves as a fresh ``threading.RLock`` (user code inside ``try_complete`` may take it
    again) without allocating one (``_operation_core.OwnLock``); operations may share one lock.

    Concurrency contract: ``safe_try_complete*`` may run on many threads at once (they serialise
    on ``op.lock``); ``force_complete`` and ``run`` may race each other and those freely.

    Attributes:
        outcome: ``None`` until the operation finished, then how: ``Outcome.COMPLETED``,
            ``Outcome.EXPIRED`` or ``Outcome.CANCELLED``. Set before ``on_complete`` runs.
        delay_ms: the timeout given to the constructor.
        lock: the lock ``safe_try_complete*`` hold while ``try_complete`` runs.

    The machinery lives in :class:`~purgatory._operation_core.OperationCore`, compiled with the
    timer, the checked constructor included; this class adds the contract. mypyc drops the
    docstrings of compiled methods, so the public ones are declared again here, documented, as
    one-line calls into the compiled functions (the purgatory's own calls bypass them).
    """

    # OperationCore (compiled: a native class) has no weakref slot of its own.
    __slots__ = ("__weakref__",)

    # No __init__ here: OperationCore's (compiled) checks ``delay_ms`` and names it in its errors.
    # An interpreted __init__ in between cost a Python frame per operation (purgatory bench).
    if TYPE_CHECKING:

        def __init__(self, delay_ms: int, lock: LockLike | None = None) -> None: ...

    @abstractmethod
    def try_complete(self) -> bool:
        """Check whether the operation can finish now; if so ``return self.force_complete()``."""
        raise NotImplementedError

    @abstractmethod
    def on_complete(self) -> None:
        """Produce the response. Runs exactly once, whichever way the operation finished."""
        raise NotImplementedError

    def on_expiration(self) -> None:
        """Extra work when the operation timed out; runs after ``on_complete``, for expiry only.

        The default does nothing. Exceptions are logged and counted; the operation stays finished.
        """

    def force_complete(self) -> bool:
        """Finish as ``COMPLETED`` unless already finished; True iff this call finished it.

        Claims the operation atomically (not under ``op.lock``), cancels its timer entry, sets
        ``outcome`` and runs ``on_complete``. Safe from inside ``try_complete`` and any thread.
        """
        return finish(self, _COMPLETED)

    def is_completed(self) -> bool:
        """True once the operation was claimed: by completion, expiry or cancellation."""
        return is_finished(self)

    def safe_try_complete(self) -> bool:
        """Under ``op.lock``: False if already finished, else ``try_complete()``."""
        return OperationCore.safe_try_complete(self)
