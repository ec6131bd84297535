"""An orders service on FastAPI that answers when Kafka has done its part — the README's example.

* ``POST /orders`` appends the order to the ``orders`` topic and answers once every in-sync
  replica has it (a :class:`ProduceResult`), or 503 with the per-partition status.
* ``GET /orders/wait?offset=N`` answers once the ``billing`` consumer group has committed past
  offset ``N`` ("the order was processed"), or 504 when ``timeout_ms`` passed first.
* Kafka unreachable, or the service shutting down: 503 with ``Retry-After`` (never a 500). On
  SIGTERM every waiting request is answered within a second, before uvicorn's graceful shutdown
  waits for them (``kp.drain_on_signals()``).

Run it against any Kafka (``purgatory kafka up`` prints the ``export PURGATORY_KAFKA_BOOTSTRAP``
line)::

    uvicorn --factory examples.orders_service:create_app --timeout-graceful-shutdown 3

Settings come from ``PURGATORY_*`` variables and ``PURGATORY_CONFIG_FILE`` (``log.format``,
timeouts, per-purgatory limits); ``/metrics`` is left to ``prometheus_client.make_asgi_app()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, HTTPException, Query, Request
from purgatory.adapters.kafka import (
    AsyncKafkaPurgatory,
    CommitResult,
    ErrorCode,
    KafkaPurgatory,
    ProduceResult,
    ProducerRecord,
    TopicPartitionKey,
)
from pydantic import BaseModel, Field

from purgatory.settings import Settings

MAX_WAIT_MS = 60_000  # a client may not hold a request open longer than this
# Shutting down or Kafka unreachable: another instance (or this one, restarted) answers soon.
RETRY_AFTER_S = 1


def _retry_later(result: ProduceResult | CommitResult) -> None:
    """503 + Retry-After when nothing was decided: the purgatory shut down, or Kafka was silent."""
    if result.shutting_down or result.unavailable:
        reason = ErrorCode.SHUTTING_DOWN if result.shutting_down else ErrorCode.KAFKA_UNAVAILABLE
        raise HTTPException(503, detail=reason.value, headers={"Retry-After": str(RETRY_AFTER_S)})


class Order(BaseModel):
    item: str = Field(min_length=1)
    quantity: int = Field(gt=0)


class Placed(BaseModel):
    partition: int
    offset: int


class Processed(BaseModel):
    offset: int
    committed: int | None


def create_app(topic: str = "orders", group: str = "billing", settings: Settings | None = None) -> FastAPI:
    """The service for ``topic``, waiting on consumer group ``group`` (settings: environment)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # connect() is cheap; leaving the block answers pending waits SHUTTING_DOWN, off the loop.
        async with KafkaPurgatory.connect(settings) as kp:
            # SIGTERM: answer the waiting requests now; uvicorn only runs this block's exit once
            # they are finished (or cancelled, a 500, after --timeout-graceful-shutdown).
            kp.drain_on_signals()
            await kp.create_topic(topic, partitions=1)  # no-op when it exists; waits for a leader
            app.state.kp = kp
            yield

    app = FastAPI(title="orders", lifespan=lifespan)

    def purgatory(request: Request) -> AsyncKafkaPurgatory:
        kp: AsyncKafkaPurgatory = request.app.state.kp
        return kp

    @app.post("/orders", status_code=201)
    async def place_order(order: Order, request: Request) -> Placed:
        record = ProducerRecord(topic, order.model_dump_json().encode(), partition=0)
        result = await purgatory(request).produce([record])  # acks=all: on every in-sync replica
        _retry_later(result)
        if not result.succeeded:  # e.g. NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT
            raise HTTPException(503, detail=[status.value for status in result.record_statuses])
        ((key, offset),) = result.appended.items()
        return Placed(partition=key.partition, offset=offset)

    @app.get("/orders/wait")
    async def wait_until_processed(
        request: Request,
        offset: Annotated[int, Query(ge=0)],
        timeout_ms: Annotated[int, Query(gt=0, le=MAX_WAIT_MS)] = 10_000,
    ) -> Processed:
        key = TopicPartitionKey(topic, 0)
        # Processed means committed past it: the group's next record is offset + 1.
        result = await purgatory(request).wait_committed(group, {key: offset + 1}, timeout_ms)
        _retry_later(result)
        if not result.succeeded:
            raise HTTPException(504, detail=f"{group} has not processed offset {offset} yet")
        return Processed(offset=offset, committed=result.committed[key])

    return app
