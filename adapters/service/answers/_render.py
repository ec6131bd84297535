"""The responses of the long-poll route for any HTTP framework path: a finished poll's 200, a refusal.

The body of a finished long poll is rendered once per operation (:mod:`._shared`); here it is put
into a Starlette response (``fetch_response``, ``fetch_body_response``) and a refusal into its
JSON answer (``error_response``).
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from ...kafka import DelayedFetch
from ._errors import RequestError
from ._shared import SharedAnswers

__all__ = ["error_response", "fetch_body_response", "fetch_response"]


def fetch_response(rendered: SharedAnswers, topic: str, partition: int, op: DelayedFetch) -> Response:
    """The 200 answer of a finished long poll (the body shared by every waiter answered the same)."""
    return fetch_body_response(rendered.body(topic, partition, op))


def fetch_body_response(body: bytes) -> Response:
    """The 200 answer whose body :meth:`SharedAnswers.body` rendered."""
    return Response(body, media_type="application/json")


def error_response(exc: RequestError) -> Response:
    """A refused request's answer: the error's JSON body, status and headers (Retry-After of a 429)."""
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
