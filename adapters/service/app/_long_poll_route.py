"""LongPollRoute: the app's long-poll route as the protocols' fast paths serve it.

The app builds one (``app.state.endpoint``; ``app.state.long_poll`` too while
``service.fast_long_poll`` is on) and the server hands it to the protocol classes
(:class:`...http._endpoint.LongPollEndpoint`): the protocols check, admit, render and count a
long poll through it, with the very checks of the ASGI route (:mod:`._requests`, the
:class:`Authenticator` its middleware asks, the header limits of :mod:`._guards`), and import
nothing of the app.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.routing import Match, Route

from purgatory.settings import Settings

from ..answers._budget import AnswerBudget
from ..answers._errors import RequestError
from ..answers._shared import SharedAnswers
from ..http._endpoint import CheckedPoll, CheckedStream, LongPollEndpoint
from ._auth import Authenticator
from ._gateway import Gateway
from ._guards import header_fields_problem
from ._requests import checked_partition, checked_topic, fetch_params
from ._stream_route import start_offset

__all__ = ["LongPollRoute"]

# Request headers that make a long poll the ASGI path's: a body or its framing, a wish to upgrade,
# 100-continue, and the proxy headers uvicorn's ProxyHeadersMiddleware reads (they may
# change the scheme authentication looks at).
_NOT_OURS = frozenset(
    {b"transfer-encoding", b"expect", b"upgrade", b"forwarded", b"x-forwarded-for", b"x-forwarded-proto"}
)


@dataclass(slots=True)
class LongPollRoute(LongPollEndpoint):
    """The app, the very :class:`Route` the ASGI path matches, the :class:`Authenticator` its
    middleware asks, and the settings of its header limits (module docstring)."""

    app: Starlette
    route: Route
    authenticator: Authenticator
    settings: Settings
    serves_long_polls: bool = True
    stream_route: Route | None = None  # GET .../stream (..stream): None leaves streams to the app

    def checked_stream(self, scope: dict[str, Any]) -> CheckedStream | None:
        """``scope``'s event stream checked and admitted as the ASGI route does; None: the app's
        (a refusal is answered there, with the same checks). Taken only where the app's hub serves
        it without scale-out (the route refuses streams then)."""
        matched = None if self.stream_route is None else self._matched(self.stream_route, scope)
        if matched is None:
            return None
        state, gateway, topic, partition = matched
        hub = getattr(state, "stream_hub", None)
        if hub is None or gateway.scaleout is not None:
            return None
        try:
            offset = start_offset(scope["headers"], QueryParams(scope["query_string"]))
            hub.admit(topic, partition)
        except (RequestError, ValidationError):
            return None
        service = self.settings.service
        return CheckedStream(
            hub, topic, partition, offset, service.stream_retry_ms, service.stream_buffer_bytes
        )

    def plain_get_headers(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """The request's (lowercased) header fields leave it to the fast path: no body or its framing,
        no wish to upgrade, no 100-continue or proxy header (``_NOT_OURS``), and within the header
        limits the ASGI path's guard checks. HTTP/1.1's and HTTP/2's fast paths both ask this. A
        ``Connection: close`` is the HTTP/1.1 path's to honour (it closes after the answer); an
        HTTP/2 request never has ``connection`` (RFC 9113 §8.2.2, h2 rejects it as a protocol error).
        """
        for name, value in headers:
            if name in _NOT_OURS:
                return False
            if name == b"content-length" and value.strip() != b"0":
                return False
        service = self.settings.service
        return header_fields_problem(headers, service.max_header_count, service.max_header_bytes) is None

    def checked_poll(self, scope: dict[str, Any]) -> CheckedPoll | None:
        """``scope``'s long poll checked as the ASGI path checks it, before admission; None: the ASGI
        path's (it gives a refusal its answer).

        The checks: authentication, the very route's match, the gateway serving, the topic policy,
        the partition, the query. Shared by the HTTP/1.1 and HTTP/2 fast paths; each
        then submits with its own callback (admission's 429 is :meth:`Gateway.fetch_then_call`'s).
        """
        matched = self._matched(self.route, scope)
        if matched is None:
            return None
        _, gateway, topic, partition = matched
        try:
            params = fetch_params(QueryParams(scope["query_string"]))
        except (RequestError, ValidationError):
            return None  # the ASGI path answers it, with the same checks
        return CheckedPoll(gateway, topic, partition, params)

    def _matched(self, route: Route, scope: dict[str, Any]) -> tuple[Any, Gateway, str, int] | None:
        """What both fast routes check first: authenticated, ``route`` matched in full, the gateway
        serving, the topic (its policy) and the partition valid: ``(app state, gateway, topic,
        partition)``; None: the app's to answer (it refuses with the same checks)."""
        if not self.authenticator.admits(scope):
            return None
        match, child = route.matches(scope)
        if match is not Match.FULL:
            return None
        state = self.app.state
        gateway: Gateway | None = getattr(state, "gateway", None)
        if gateway is None or not gateway.serving:
            return None
        path_params = child["path_params"]
        try:
            topic = checked_topic(str(path_params["topic"]), state.topic_policy)
            partition = checked_partition(str(path_params["partition"]))
        except RequestError:
            return None
        return state, gateway, topic, partition

    @property
    def rendered(self) -> SharedAnswers:
        rendered: SharedAnswers = self.app.state.rendered_fetches
        return rendered

    def answer_budget(self) -> AnswerBudget | None:
        gateway: Gateway | None = getattr(self.app.state, "gateway", None)
        return None if gateway is None else gateway.answer_budget

    def count_answers(self, status: int, body: bytes | memoryview | None = None, n: int = 1) -> None:
        self.app.state.answers.count(status, body, n)

    def count_http11(self, data: bytes, n: int = 1) -> None:
        self.app.state.answers.count_http11(data, n)

    def count_unexpected_error(self) -> None:
        self.app.state.unexpected_errors.count += 1
