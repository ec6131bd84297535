"""LongPollEndpoint: what the protocols' fast paths know of the app, handed to them at construction.

Why: the HTTP/1.1 and HTTP/2 protocols (:mod:`.h1`, :mod:`.h2`) serve the long-poll route below
the ASGI app, with the app's own checks, admission and rendering; every other request, and every
long poll they do not take, goes to the app. They import nothing of the app: the app builds its
endpoint (``app.state.endpoint``, a :class:`LongPollEndpoint`), and the server that builds the
protocol classes for it hands it to them (``uvicorn_options(..., endpoint=)``). Under uvicorn's
own command line (``--http purgatory.adapters.service:LongPollHttp``) the app's lifespan puts it
into the lifespan state under :data:`ENDPOINT_STATE_KEY`, which uvicorn hands every protocol it
makes (``app_state``): the class reads it there at construction, never through the app or
uvicorn's wrappers around it. A protocol without an endpoint serves every request through the app.

The endpoint answers four questions — may this request's header fields take the fast path; is
this scope a long poll the route would serve (and with which admitted waits); how is a finished
poll rendered (:class:`SharedAnswers`: one answer per operation, shared by every protocol);
what is counted — and gives the service's settings and its answer budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from purgatory.settings import Settings

from ...kafka import DelayedFetch
from ..answers._budget import AnswerBudget
from ..answers._shared import SharedAnswers
from ..stream import StreamHub

__all__ = [
    "ENDPOINT_STATE_KEY",
    "CheckedPoll",
    "CheckedStream",
    "LongPollEndpoint",
    "PollWaits",
    "endpoint_in_state",
]

# The lifespan state's key for the app's endpoint (ASGI lifespan state: the server hands the same
# dict to every connection it serves; a namespaced key, as the spec asks of extensions).
ENDPOINT_STATE_KEY = "purgatory.long_poll_endpoint"


class PollWaits(Protocol):
    """What a fast path asks of the service for one admitted long poll (the app's gateway)."""

    @property
    def answer_budget(self) -> AnswerBudget: ...

    def fetch_then_call(
        self, topic: str, partition: int, params: Any, callback: Callable[[DelayedFetch], None]
    ) -> object | None:
        """The waiter (opaque to the protocols: for :meth:`abandon_fetch`), or None: not submitted.

        ``callback(op)`` runs once, on the loop, with the finished operation whose answer is the
        waiter's (equal long polls share one: its group's, or its own expiry's)."""

    def fetch_finished(self, op: DelayedFetch, requested_offset: int | None) -> bool: ...

    async def check_fetch_offset(self, op: DelayedFetch, budget_s: float | None = None) -> None: ...

    def check_answer_fits(self, answer: bytes) -> None: ...

    def abandon_fetch(self, waiter: Any) -> None: ...


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
    def rendered(self) -> SharedAnswers:
        """The app's rendered answers, shared by the route and every protocol."""

    @abstractmethod
    def answer_budget(self) -> AnswerBudget | None:
        """The gateway's answer budget (None before the app started)."""

    @abstractmethod
    def count_answers(self, status: int, body: bytes | memoryview | None = None, n: int = 1) -> None:
        """Count answers given below the app (the app's own middleware counts its own)."""

    @abstractmethod
    def count_http11(self, data: bytes, n: int = 1) -> None:
        """Count ``n`` HTTP/1.1 answers written as these bytes."""

    @abstractmethod
    def count_unexpected_error(self) -> None:
        """Count a bug answered as a JSON 500 (as the app's catch-all does)."""


def endpoint_in_state(app_state: dict[str, Any]) -> LongPollEndpoint | None:
    """The endpoint the app's lifespan put into the server's lifespan state (None: there is none)."""
    endpoint = app_state.get(ENDPOINT_STATE_KEY)
    return endpoint if isinstance(endpoint, LongPollEndpoint) else None
