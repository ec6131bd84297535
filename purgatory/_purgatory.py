"""DelayedOperationPurgatory: the interpreted checked constructor over the compiled PurgatoryCore.

Split because a compiled ``__init__`` refuses bad arguments before our checks can name them;
the core (``_purgatory_core.py``) imports nothing back from here or from ``_operation.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._purgatory_core import (
    DEFAULT_PURGE_INTERVAL,
    REAPER_POLL_MS,
    ExpiredOperationReaper,
    PurgatoryCore,
    PurgatoryListener,
    T,
)
from .timer import SystemTimer, Timer

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["DelayedOperationPurgatory", "ExpiredOperationReaper", "PurgatoryListener"]


class DelayedOperationPurgatory(PurgatoryCore[T]):
    """Holds delayed operations until each is completed by a key event or expires — exactly once.

    An operation is watched on one or more keys (any hashable values). ``check_and_complete(key)``
    is called by whoever knows that something about ``key`` changed; it re-checks the operations
    watched there. Each operation is also in the timer, which expires it after ``delay_ms``.

    Concurrency: every public method is thread-safe. Watcher lists are split over ``SHARDS``
    shards by key hash so that threads on different keys rarely share a lock. No purgatory lock is
    held while user code (``try_complete``, ``on_complete``, ``on_expiration``) runs, except
    ``op.lock``; so user code may call back into the purgatory, on any key. Completed operations
    are released from all their watch lists as they finish (beyond Kafka, see KAFKA-19389: one
    store, their entries compacted away once half a list is dead), and a watch that races a
    finish is released again by the watcher; so ``watched()`` counts a finished operation only
    while its finish is under way. The reaper's purge stays as a safety net.

    Methods (compiled with mypyc, which drops method docstrings: they are summarised here):
        try_complete_else_watch(op, keys) -> bool: try to complete ``op``; if not, watch it on
            every key and time it. True iff completed by this call. Raises
            ``PurgatoryClosedError`` after shutdown, ``PurgatoryFullError`` past ``max_pending``,
            ``ValueError`` for no keys, ``TypeError`` for an unhashable key.
        await watch(op, keys) -> Outcome: the same from asyncio, returning how it finished;
            cancelling the awaiting task cancels the operation.
        check_and_complete(key) -> int: re-check the operations watched on ``key``; how many
            this call finished.
        cancel_for_key(key) -> list: unwatch and untime the key's operations, unfinished: they
            are the caller's to finish.
        watched() -> int: watcher entries (Kafka's PurgatorySize).
        num_delayed() -> int: operations in the timer (Kafka's NumDelayedOperations).
        shutdown(drain=True): stop the reaper; with ``drain`` expire every operation still held.
        add_listener(listener) / remove_listener(listener): lifecycle observers (the journal).
        stats: finished operations by outcome, and user-code errors.
        closed: True once shut down.
    """

    def __init__(
        self,
        name: str,
        timer: Timer | None = None,
        broker_id: int = 0,
        purge_interval: int = DEFAULT_PURGE_INTERVAL,
        reaper_enabled: bool = True,
        timer_enabled: bool = True,
        max_pending: int | None = None,
        *,
        reaper_poll_ms: int = REAPER_POLL_MS,
        max_pending_per_key: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if isinstance(purge_interval, bool) or not isinstance(purge_interval, int) or purge_interval < 0:
            raise ValueError(f"purge_interval must be an int >= 0, got {purge_interval!r}")
        if max_pending is not None and (
            isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending <= 0
        ):
            raise ValueError(f"max_pending must be a positive int or None, got {max_pending!r}")
        if max_pending_per_key is not None and (
            isinstance(max_pending_per_key, bool)
            or not isinstance(max_pending_per_key, int)
            or max_pending_per_key <= 0
        ):
            raise ValueError(
                f"max_pending_per_key must be a positive int or None, got {max_pending_per_key!r}"
            )
        if isinstance(reaper_poll_ms, bool) or not isinstance(reaper_poll_ms, int) or reaper_poll_ms <= 0:
            raise ValueError(f"reaper_poll_ms must be a positive int, got {reaper_poll_ms!r}")
        if isinstance(broker_id, bool) or not isinstance(broker_id, int):
            raise ValueError(f"broker_id must be an int, got {broker_id!r}")
        PurgatoryCore.__init__(
            self,
            name,
            timer,
            broker_id,
            purge_interval,
            bool(reaper_enabled),
            bool(timer_enabled),
            max_pending,
            reaper_poll_ms,
            max_pending_per_key,
        )

    @classmethod
    def from_settings(
        cls, name: str, settings: Settings | None = None, **kwargs: Any
    ) -> DelayedOperationPurgatory[T]:
        """A purgatory configured from :class:`~purgatory.settings.Settings` (its per-name overrides
        over the top-level values), owning a SystemTimer with the configured tick and wheel size."""
        from .settings import load_settings

        effective = settings if settings is not None else load_settings()
        options = effective.for_purgatory(name)
        given_timer = kwargs.pop("timer", None)
        timer = given_timer or SystemTimer(name, tick_ms=options["tick_ms"], wheel_size=options["wheel_size"])
        purgatory = cls(
            name,
            timer=timer,
            broker_id=kwargs.pop("broker_id", effective.broker_id),
            purge_interval=options["purge_interval"],
            max_pending=options["max_pending"],
            reaper_poll_ms=options["reaper_poll_ms"],
            max_pending_per_key=options["max_pending_per_key"],
            **kwargs,
        )
        purgatory._owns_timer = given_timer is None  # a timer built here closes with the purgatory
        return purgatory
