"""Who may call the service, and which topics anyone may name (``service.*`` settings).

Authentication is optional and off by default:

* **Bearer tokens** (``service.auth_tokens``): ``Authorization: Bearer <token>``. The presented
  token is compared with *every* configured token in constant time (``hmac.compare_digest``),
  so neither the time taken nor an early exit says how much of a token was right, or which.
* **Mutual TLS** (``service.tls_client_auth = "required"``): uvicorn's TLS handshake refuses a
  client without a certificate signed by ``service.tls_ca_certs``, so every request that
  reaches the app comes from a verified client and counts as authenticated.

With either configured, every route but ``/healthz`` answers 401 to an unauthenticated client
(JSON, ``WWW-Authenticate: Bearer``). ``/healthz`` answers everyone — load balancers probe it —
but shows cluster details only to an authenticated client (:func:`is_authenticated`).

The **topic policy** holds whether or not authentication is on: a topic must match one of
``allowed_topics`` and none of ``denied_topics`` (glob patterns, case-sensitive as Kafka's
names are), else 403. The default denies names starting with ``_``: Kafka's internal topics
(``__consumer_offsets``, ``__transaction_state``) and Confluent's (``_confluent-*``, ``_schemas``).

Concurrency contract: immutable after construction; safe from any task.
"""

from __future__ import annotations

import fnmatch
import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..answers._errors import RequestError
from ..settings import ServiceSettings

__all__ = ["PUBLIC_PATHS", "Authenticator", "RequireAuth", "TopicPolicy", "is_authenticated"]

PUBLIC_PATHS = frozenset({"/healthz"})  # answered without authentication (with less detail)
_AUTHENTICATED = "authenticated"  # key in the ASGI scope's "state" (Starlette's request.state)


class Authenticator:
    """Decides whether one request is authenticated (module docstring)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self._tokens = tuple(t.get_secret_value().encode("utf-8") for t in settings.auth_tokens)
        self.mutual_tls = settings.tls_client_auth == "required" and settings.tls_certfile is not None
        self.enabled = bool(self._tokens) or self.mutual_tls

    def authenticated(self, scope: Scope) -> bool:
        if self.mutual_tls and scope.get("scheme") == "https":
            return True  # the handshake verified the client's certificate (module docstring)
        presented = _bearer(scope)
        if presented is None or not self._tokens:
            return False
        matched = False
        for token in self._tokens:  # all of them, always: the time says nothing about which matched
            matched |= hmac.compare_digest(presented, token)
        return matched

    def admits(self, scope: Scope) -> bool:
        """False when :class:`RequireAuth` answers this request 401."""
        return not self.enabled or scope["path"] in PUBLIC_PATHS or self.authenticated(scope)


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class RequireAuth:
    """401 for unauthenticated requests outside :data:`PUBLIC_PATHS`; marks the scope either way."""

    def __init__(self, app: ASGIApp, *, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            ok = self.authenticator.authenticated(scope)
            scope.setdefault("state", {})[_AUTHENTICATED] = ok
            if not ok and not self.authenticator.admits(scope):
                error = RequestError(
                    401, "AUTHENTICATION_FAILED", "authorization", "a valid bearer token is required"
                )
                response = JSONResponse(
                    error.body(), status_code=error.status, headers={"WWW-Authenticate": "Bearer"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def is_authenticated(scope: Scope) -> bool:
    """What :class:`RequireAuth` decided for this request (False when it did not run)."""
    return bool(scope.get("state", {}).get(_AUTHENTICATED, False))


class TopicPolicy:
    """Which topics clients may name: allowed and not denied (module docstring)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.allowed = settings.allowed_topics
        self.denied = settings.denied_topics

    def check(self, topic: str) -> None:
        """Raise a 403 :class:`RequestError` naming ``topic`` unless the policy lets clients use it."""
        denied = next((p for p in self.denied if fnmatch.fnmatchcase(topic, p)), None)
        if denied is not None:
            reason = f"matches the denied pattern {denied!r}"
        elif not any(fnmatch.fnmatchcase(topic, p) for p in self.allowed):
            reason = f"matches none of the allowed patterns {list(self.allowed)}"
        else:
            return
        raise RequestError(
            403, "TOPIC_AUTHORIZATION_FAILED", "topic", f"topic {topic!r} is not available here: {reason}"
        )
