"""Redirect answers for a request that reached the wrong instance, for any HTTP framework.

``redirect_for(owner, path_and_query)`` turns an :class:`Owner` into what to answer — nothing
(serve it here), a ``307 Temporary Redirect`` to the owner (method and body kept, so a produce is
re-sent there, not re-appended here), or ``503`` with ``Retry-After`` while no owner is known —
as a plain :class:`Redirect` (status, headers, JSON body). Starlette::

    answer = redirect_for(ownership.owner(key), request.url.path + "?" + request.url.query)
    if answer is not None:
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

FastAPI, aiohttp, Flask or Django wrap the same three fields in their own response type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...kafka import Moved, Owner, OwnerStatus

__all__ = ["Redirect", "moved_answer", "redirect_for"]

DEFAULT_RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Redirect:
    """An HTTP answer: ``status``, ``headers`` (``Location``, ``Retry-After``), JSON ``body``."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)


def redirect_for(
    owner: Owner, path_and_query: str, *, retry_after_s: int = DEFAULT_RETRY_AFTER_S
) -> Redirect | None:
    """What to answer a request for a partition whose owner is ``owner`` (None: serve it here)."""
    if owner.served_here:
        return None
    if owner.status is OwnerStatus.OTHER and owner.url:
        headers = {"Location": owner.url.rstrip("/") + path_and_query}
        if owner.moving:
            headers["Retry-After"] = str(retry_after_s)
        body = {
            "error": "NOT_LEADER_OR_FOLLOWER",
            "field": None,
            "message": f"this partition is served by {owner.url}",
            "owner": owner.url,
            "generation": owner.generation,
        }
        return Redirect(307, headers, body)
    return Redirect(
        503,
        {"Retry-After": str(retry_after_s)},
        {
            "error": "NOT_LEADER_OR_FOLLOWER",
            "field": None,
            "message": "this partition has no owner right now (the service's group is rebalancing): retry",
            "owner": None,
            "generation": owner.generation,
        },
    )


def moved_answer(
    moved: Moved,
    retry_path_and_query: str,
    *,
    retry_after_s: int = DEFAULT_RETRY_AFTER_S,
    status_if_known: int = 307,
) -> Redirect:
    """The answer to an operation finished :class:`Moved`: where to retry it.

    With the new owner known: ``status_if_known`` (307 repeats the request there; 303 turns it
    into a GET, for a produce whose records were already appended) to the owner's URL. Unknown
    (the group is still rebalancing): 503 with ``Retry-After`` and a relative ``Location`` any
    instance answers (it redirects once the owner is known).
    """
    body = {
        "outcome": "MOVED",
        "reason": moved.reason,
        "owner": moved.owner_url,
        "generation": moved.generation,
    }
    if moved.owner_url:
        return Redirect(
            status_if_known, {"Location": moved.owner_url.rstrip("/") + retry_path_and_query}, body
        )
    return Redirect(503, {"Retry-After": str(retry_after_s), "Location": retry_path_and_query}, body)
