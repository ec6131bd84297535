"""LongPollEndpoint: what the protocols' fast paths know of the app, handed to them at construction.

Why: the HTTP/1.1 and HTTP/2 protocols (:mod:`.h1`, :mod:`.h2`) serve the long-poll route below
the ASGI app, with the app's own checks, admission and rendering; every other request, and every
long poll they do not take, goes to the app. They import nothing of the app: the app builds its
endpoint (``app.state.endpoint``, a :class:`LongPollEndpoint`), and the server that builds the
protocol classes for it hands it to them (``uvicorn_options(..., endpoint=)``). A protocol class
made without one looks it up once in the app it serves, through uvicorn's wrappers
(:func:`endpoint_in`); none there: every request goes through the app.

The endpoint answers four questions — may this request's header fields take the fast path; is
this scope a long poll the route would serve (and with which admitted waits); how is a finished
poll rendered (:class:`RenderedFetches`, shared by every protocol); what is counted — and gives
the service's settings and its answer budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

from purgatory.settings import Settings

from ...kafka import DelayedFetch
from ..answers._budget import AnswerBudget
from ..answers._render import RenderedFetches
from ..stream import StreamHub

__all__ = ["CheckedPoll", "CheckedStream", "LongPollEndpoint", "PollWaits", "app_state", "endpoint_in"]

# How deep the app may sit inside uvicorn's wrappers (proxy headers, message logger).
_MAX_WRAPPERS = 8
_T = TypeVar("_T")


class PollWaits(Protocol):
    """What a fast path asks of the service for one admitted long poll (the app's gateway)."""

    @property
    def answer_budget(self) -> AnswerBudget: ...

    def fetch_then_call(
        self, topic: str, partition: int, params: Any, callback: Callable[[DelayedFetch], None]
    ) -> DelayedFetch | None: ...

    def fetch_finished(self, op: DelayedFetch, requested_offset: int | None) -> bool: ...

    async def check_fetch_offset(self, op: DelayedFetch, budget_s: float | None = None) -> None: ...

    def check_answer_fits(self, answer: bytes) -> None: ...

    def abandon_fetch(self, op: DelayedFetch) -> None: ...


class CheckedPoll(NamedTuple):
    """A long poll that passed the route's checks, ready for ``gateway.fetch_then_call``."""

    gateway: PollWaits
    topic: str
    partition: int
    params: Any  # the route's parsed query, handed back to fetch_then_call (its .offset: the poll's)


class CheckedStream(NamedTuple):
    """An event stream that passed the route's checks and admission, ready for ``hub.start``."""

    hub: StreamHub
    topic: str
    partition: int
    offset: int | None  # Last-Event-ID's, else ?offset='s; None: the partition's end
    retry_ms: int  # the SSE ``retry:`` the stream opens with
    buffer_bytes: int  # service.stream_buffer_bytes


class LongPollEndpoint(ABC):
    """The app's long-poll route as the protocols' fast paths serve it (module docstring)."""

    __slots__ = ()

    settings: Settings  # the very object the app's gateway admits by
    serves_long_polls: bool  # service.fast_long_poll: False leaves every long poll to the app

    @abstractmethod
    def plain_get_headers(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether a request's (lowercased) header fields leave it to the fast path."""

    @abstractmethod
    def checked_poll(self, scope: dict[str, Any]) -> CheckedPoll | None:
        """``scope``'s long poll checked as the app checks it; None: the app's to answer."""

    def checked_stream(self, scope: dict[str, Any]) -> CheckedStream | None:
        """``scope``'s event stream checked and admitted as the app's route does; None: the app's."""
        return None

    @property
    @abstractmethod
    def rendered(self) -> RenderedFetches:
        """The app's rendered answers, shared by the route and every protocol."""

    @abstractmethod
    def answer_budget(self) -> AnswerBudget | None:
        """The gateway's answer budget (None before the app started)."""

    @abstractmethod
    def count_answers(self, status: int, body: bytes | memoryview | None = None, n: int = 1) -> None:
        """Count answers given below the app (the app's own middleware counts its own)."""

    @abstractmethod
    def count_http11(self, data: bytes) -> None:
        """Count one HTTP/1.1 answer written as bytes."""

    @abstractmethod
    def count_unexpected_error(self) -> None:
        """Count a bug answered as a JSON 500 (as the app's catch-all does)."""


def app_state(app: Any, name: str, kind: type[_T]) -> _T | None:
    """The app's ``state.<name>`` if it is a ``kind``, looked up through uvicorn's wrappers."""
    for _ in range(_MAX_WRAPPERS):
        value = getattr(getattr(app, "state", None), name, None)
        if isinstance(value, kind):
            return value
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


def endpoint_in(app: Any) -> LongPollEndpoint | None:
    """The endpoint an app built (``app.state.endpoint``), through uvicorn's wrappers."""
    return app_state(app, "endpoint", LongPollEndpoint)  # type: ignore[type-abstract]  # isinstance only
