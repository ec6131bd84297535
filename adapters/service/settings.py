"""The HTTP service's settings sections: ``service`` (limits, authentication, topics, TLS) and
``admission`` (how many waiters it holds).

The core composes them into :class:`purgatory.settings.Settings` through the entry-point group
``purgatory.settings`` (pyproject.toml), so they are read from ``PURGATORY_SERVICE__*`` /
``PURGATORY_ADMISSION__*`` and the TOML tables ``[service]`` / ``[admission]`` as before they
moved here. Adding a limit is a field here and nothing else: the variable, the TOML key, the
JSON Schema (``purgatory config schema``) and ``purgatory config show`` follow.

Typed reading: ``ServiceSettings.of(settings)`` returns the ``service`` section as a
``ServiceSettings`` for mypy; ``settings.service`` works as well but is ``Any`` to mypy (the
core's ``Settings`` cannot name an adapter's class).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from purgatory.settings import DurationMs, NonNegativeInt, PositiveInt, Section

__all__ = ["AdmissionSettings", "ServiceSettings"]


class AdmissionSettings(Section):
    """How many waiters the example service holds (docs/design.md §8): past a limit, 429 + Retry-After.

    Memory is bounded by them: at most ``max_waiters`` operations (with their HTTP requests)
    are held, at most ``max_waiters_per_key`` of them on one partition, none longer than
    ``max_wait_ms``.
    """

    max_waiters: PositiveInt = Field(
        60_000, description="Waiting requests (long polls and produces) one service process holds."
    )
    max_waiters_per_key: PositiveInt = Field(
        50_000, description="Waiting requests on one partition (unless purgatories.<name> sets one)."
    )
    max_wait_ms: DurationMs = Field(
        30_000, description="Longer long polls (max_wait_ms) are clamped to this: answered by then."
    )
    retry_after_s: PositiveInt = Field(1, description="Retry-After of a 429 answer (service full).")
    gc_thresholds: tuple[PositiveInt, NonNegativeInt, NonNegativeInt] | None = Field(
        (50_000, 20, 100),
        description="The service's cyclic-GC thresholds while it serves (gc.set_threshold; start-up "
        "objects frozen): held waiters are long-lived. None: the interpreter's (700, 10, 10).",
    )


class ServiceSettings(Section):
    """The example HTTP service (``purgatory.adapters.service``): limits, authentication, topics.

    Authentication is off until configured: ``auth_tokens`` (clients send ``Authorization:
    Bearer <token>``) and/or TLS with ``tls_client_auth = "required"`` (every client presents a
    certificate signed by ``tls_ca_certs``). ``/healthz`` answers everyone, but shows cluster
    details (bootstrap servers, reachability) only to an authenticated client.
    """

    max_header_count: PositiveInt = Field(
        100, description="Requests with more header fields are refused (431)."
    )
    max_header_bytes: PositiveInt = Field(
        16 * 1024,
        description="Bound on a request's header block (431; h11 refuses larger heads before the app).",
    )
    head_read_timeout_ms: DurationMs = Field(
        10_000,
        description="A request head (request line and header fields) not received in full within "
        "this long is answered 408 and the connection closed (headers trickled slowly: slowloris).",
    )
    fast_long_poll: bool = Field(
        True,
        description="Serve idle long polls (GET .../partitions/{p}/records) below the ASGI app: a "
        "waiting poll holds no asyncio task and its answer is written from the batch wake-up "
        "(same checks and answers as the ASGI route; anything else still goes through it).",
    )
    answer_budget_bytes: PositiveInt = Field(
        256 * 1024 * 1024,
        description="Bound on the bytes of long-poll answers held while their clients are slow to read "
        "them (distinct answers, each counted once however many connections share it). Past it a new "
        "long poll is answered 429 MEMORY_BUDGET_EXCEEDED with Retry-After, and so is a waiting one "
        "whose answer would pass it (docs/operations/limits.md).",
    )
    gathered_budget_bytes: PositiveInt = Field(
        128 * 1024 * 1024,
        description="Bound on the records long polls waiting for min_bytes hold, all together (each "
        "read shared by equal waiters counted once). A waiting poll whose next read would pass it is "
        "answered at once with the records it has (docs/operations/limits.md).",
    )
    http2: bool = Field(
        True,
        description="Accept HTTP/2 with prior knowledge (h2c, the connection preface) on the same port "
        "beside HTTP/1.1: one connection multiplexes many long polls (idle ones served below the ASGI "
        "app, as with fast_long_poll; other requests bridged to it). Needs the service's own server.",
    )
    body_read_timeout_ms: DurationMs = Field(
        10_000,
        description="A request body not received in full within this long is answered 408 "
        "(a Content-Length larger than the body sent holds nothing forever).",
    )
    stream_heartbeat_ms: DurationMs = Field(
        15_000,
        description="An idle event stream (GET .../partitions/{p}/stream) gets a comment line this often, "
        "so proxies and load balancers do not close it (at most admission.max_wait_ms apart).",
    )
    stream_buffer_bytes: PositiveInt = Field(
        1024 * 1024,
        description="Bytes of events one event stream may have unsent (its reader is slow). Past it the "
        "stream ends with an 'overflow' event naming the offset to resume from; memory stays bounded.",
    )
    stream_retry_ms: DurationMs = Field(
        1_000,
        description="The reconnection delay an event stream tells its EventSource (SSE 'retry:' field).",
    )
    auth_tokens: tuple[SecretStr, ...] = Field(
        (), description="Bearer tokens accepted (any one); empty: no token authentication."
    )
    allowed_topics: tuple[str, ...] = Field(
        ("*",), description="Glob patterns (fnmatch, case-sensitive) of the topics clients may use."
    )
    denied_topics: tuple[str, ...] = Field(
        ("_*",),
        description="Glob patterns refused even when allowed (403). Default: names starting with '_' "
        "(Kafka's __consumer_offsets, __transaction_state; Confluent's _confluent-*, _schemas).",
    )
    tls_certfile: str | None = Field(None, description="Serve HTTPS with this certificate chain (PEM).")
    tls_keyfile: str | None = Field(None, description="Private key of tls_certfile (PEM).")
    tls_keyfile_password: SecretStr | None = None
    tls_ca_certs: str | None = Field(None, description="CA bundle that client certificates must chain to.")
    tls_client_auth: Literal["none", "required"] = Field(
        "none", description="required: mutual TLS, a client without a valid certificate is refused."
    )

    @field_validator("tls_client_auth")
    @classmethod
    def _mutual_tls_is_complete(cls, value: str, info: ValidationInfo) -> str:
        # "required" without a server certificate or a CA would serve plain HTTP unauthenticated.
        # (A field validator, not a model one: the error then quotes this value, not the
        # section's, which may hold the tokens.)
        missing = [name for name in ("tls_certfile", "tls_ca_certs") if info.data.get(name) is None]
        if value == "required" and missing:
            raise ValueError(f"'required' needs {' and '.join(missing)}")
        return value
