"""AnswerBudget: the process-wide bound on the bytes of long-poll answers waiting to be written.

Why: an answer the client does not read at once stays with its connection until the last byte
left — the HTTP/1.1 fast path's answer written piece by piece, an HTTP/2 stream's body held back by
its windows or by the connection's write backlog, the ASGI path's response waiting for its
transport to drain. Each is at most one answer (16 MiB of records, ~22 MB of JSON) per connection
or stream, and answers alike are one shared object; but waiters answered *differently* (other
offsets, other ``max_bytes``) on connections that do not read hold one answer each: 1,000 of them
were 22 GB. The budget counts the distinct answer objects held this way, once each however many
connections share one, and refuses what would pass ``service.answer_budget_bytes``:

* a new long poll while the budget is spent: ``429 MEMORY_BUDGET_EXCEEDED`` + ``Retry-After``,
  before anything is submitted (:meth:`Gateway.fetch`, :meth:`Gateway.fetch_then_call`);
* a waiting poll whose answer is ready but would take the held bytes past the budget (an answer
  not already held, larger than one write): answered at once with the same 429 instead of its
  records — small, written whole. A long poll repeated at the same offset loses nothing.

An answer is taken when it does not fit only if nothing is held at all, so one answer larger
than the whole budget still goes out (else it never would): the held bytes stay within
``max(answer_budget_bytes, largest answer)``. docs/operations/limits.md gives the process's whole bound.

**Released answers leave the caches.** When the last holder of an answer lets go of it, the
caches that kept it for reuse are told (:meth:`AnswerBudget.on_release`: the rendered answers),
and drop it: a large body is shared while connections write it, not kept once none does. Why: a
cold service's first round of issue 31's back-pressure replay (100 unread 4 MB long polls, then
the close) left +43 MB resident for good — the ~18 MB body as the last rendered answer and the
same bytes again as the HTTP/1.1 fast path's last response — against the issue's 10 MB.

Concurrency contract: the event loop's thread only (answers are written there).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import time
from collections.abc import Callable
from typing import Any

from ._errors import RequestError

__all__ = ["AnswerBudget", "HeldBodies", "memory_budget_exceeded"]


# After answers of at least this many bytes in all were let go of (nothing held any more), the C
# allocator is asked to give its free pages back to the system (at most once per TRIM_EVERY_S).
TRIM_AFTER_BYTES = 8 * 1024 * 1024
TRIM_EVERY_S = 1.0


# Allocations from this size up are mapped pages of their own, unmapped when freed (below).
MMAP_THRESHOLD_BYTES = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def _fix_mmap_threshold(libc: ctypes.CDLL) -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES (process-wide); False where it cannot.

    Why: glibc serves a block past its mmap threshold (128 KiB at first) with pages of its own,
    returned to the system when it is freed; but freeing one raises the threshold to that
    block's size (up to 32 MiB, "dynamic threshold"), so after the first large answer every
    later body (~18 MB in issue 31's replay), the JSON rendered for it and the buffers around
    them come from the heap, whose freed pages stay resident around the live ones: each warm
    round of the replay peaked at +53-56 MB for one 18 MB body (a render alone: +41 MB resident
    with the body alive, against +19 MB with the threshold fixed). Setting it explicitly turns
    the adjustment off: large blocks are always mapped, their pages gone at their free.
    """
    try:
        mallopt = libc.mallopt
    except AttributeError:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where there is none (musl, macOS).

    Why: large answers and the records they were rendered from are freed back to glibc's heaps
    (the loop's and the read threads' arenas), which keep free pages mapped: after a client that
    never read its 4 MB answers closed, +23-28 MB stayed resident for good. ``malloc_trim``
    returns every arena's whole free pages (glibc >= 2.8); ctypes releases the GIL meanwhile.
    """
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if libc is None or trim is None:
        return None
    _fix_mmap_threshold(libc)  # where there is malloc_trim, there is glibc's mallopt
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class AnswerBudget:
    """Bytes of the distinct answer objects connections hold while writing them (module docstring)."""

    __slots__ = (
        "_freed",
        "_holders",
        "_last_trim",
        "_released",
        "_trim",
        "_trim_due",
        "held",
        "limit",
        "refused",
        "trims",
    )

    def __init__(self, limit: int, *, trim: bool = True) -> None:
        self.limit = limit
        self.held = 0  # bytes of the distinct objects in _holders
        self.trims = 0  # malloc_trim calls made (tests and /healthz read it)
        self._freed = 0  # bytes let go of since the last trim
        self._last_trim = 0.0
        self._trim = _malloc_trim() if trim else None
        self.refused = 0  # polls and answers refused because of the budget (a counter for /healthz)
        # id(answer) -> [answer, holders, size]: the answer itself is kept, so its id is not
        # reused while counted (its holders keep it alive anyway).
        self._holders: dict[int, list[Any]] = {}
        self._released: list[Callable[[object], object]] = []  # on_release's listeners
        self._trim_due = False  # a trim is scheduled on the loop (_give_pages_back)

    def on_release(self, forget: Callable[[object], object]) -> None:
        """Call ``forget(answer)`` when the last holder of an answer let go of it: a cache keeping
        that very object drops it (module docstring)."""
        self._released.append(forget)

    @property
    def spent(self) -> bool:
        """Whether new long polls are refused: the held bytes reached the budget."""
        return self.held >= self.limit

    def fits(self, answer: bytes) -> bool:
        """Whether ``answer`` may be held: it is already (shared), fits what is left, or nothing is held."""
        return id(answer) in self._holders or not self.held or self.held + len(answer) <= self.limit

    def take(self, answer: bytes) -> None:
        """One more holder of ``answer`` (its bytes counted with the first)."""
        entry = self._holders.get(id(answer))
        if entry is None:
            self._holders[id(answer)] = [answer, 1, len(answer)]
            self.held += len(answer)
        else:
            entry[1] += 1

    def give_back(self, answer: object) -> None:
        """A holder of ``answer`` let go of it (written, or its connection lost); a memoryview's
        ``obj`` is the answer it shows."""
        entry = self._holders.get(id(answer))
        if entry is None or entry[0] is not answer:
            return
        entry[1] -= 1
        if not entry[1]:
            del self._holders[id(answer)]
            self.held -= entry[2]
            self._freed += entry[2]
            for forget in self._released:
                forget(answer)
            if not self.held and self._freed >= TRIM_AFTER_BYTES:
                self._schedule_trim()

    def _schedule_trim(self) -> None:
        """Trim on the loop's next turn, or once TRIM_EVERY_S passed since the last trim.

        Not now: the caller still holds the answer (the view it wrote from, the argument), so
        its pages are not free yet — a trim here returned nothing of it. Not skipped when too
        soon either: the pages of the last answers of a burst would stay resident until some
        later answer was let go of.
        """
        if self._trim is None or self._trim_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): at once
            self._give_pages_back()
            return
        self._trim_due = True
        loop.call_later(max(0.0, self._last_trim + TRIM_EVERY_S - time.monotonic()), self._give_pages_back)

    def _give_pages_back(self) -> None:
        """Nothing is held any more after large answers: the allocator's free pages go back to
        the system (see :func:`_malloc_trim`), at most once per TRIM_EVERY_S."""
        self._trim_due = False
        if self._trim is None or self.held:
            return  # new answers are held meanwhile: their release trims
        self._last_trim = time.monotonic()
        self._freed = 0
        self._trim()
        self.trims += 1


def memory_budget_exceeded(budget: AnswerBudget, retry_after_s: int) -> RequestError:
    """The 429 of a poll refused by ``budget``: the client comes back after Retry-After."""
    budget.refused += 1
    return RequestError(
        429,
        "MEMORY_BUDGET_EXCEEDED",
        None,
        f"answers waiting to be written hold {budget.held} bytes, the service's budget is "
        f"{budget.limit} (service.answer_budget_bytes): retry later",
        headers={"Retry-After": str(retry_after_s)},
    )


class HeldBodies(dict[int, memoryview]):
    """An HTTP/2 connection's bodies held back (stream id -> what is left to send), counted in a budget.

    Each view's ``obj`` (the whole body, shared with every stream answered alike) is taken from
    the budget while a stream holds it and given back when the stream lets go (sent, reset, or
    the connection lost: ``pop`` and ``clear``, the only ways out the session uses). A dict, so
    lookups and walks stay C-level: a slow reader's 1,000 blocked streams are walked per drain.
    """

    __slots__ = ("_budget",)

    def __init__(self, budget: AnswerBudget | None) -> None:
        super().__init__()
        self._budget = budget

    def __setitem__(self, stream_id: int, view: memoryview) -> None:
        old = self.get(stream_id)
        super().__setitem__(stream_id, view)
        if self._budget is None or (old is not None and old.obj is view.obj):
            return  # the same body, less of it left: counted once already
        if old is not None:
            self._budget.give_back(old.obj)
        self._budget.take(view.obj)  # type: ignore[arg-type]  # a view of an answer's bytes

    def pop(self, stream_id: int, default: Any = None) -> Any:
        view = super().pop(stream_id, None)
        if view is None:
            return default
        if self._budget is not None:
            self._budget.give_back(view.obj)
        return view

    def clear(self) -> None:
        for stream_id in list(self):
            self.pop(stream_id)
