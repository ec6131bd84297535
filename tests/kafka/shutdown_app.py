"""The orders example as uvicorn runs it in test_embedding_shutdown.py: its topic and group from
the environment (unique per test), plus ``/pending``, how many calls wait in the purgatories.

Run as ``uvicorn --factory tests.kafka.shutdown_app:create_app``.
"""

from __future__ import annotations

import os

from fastapi import FastAPI, Request

from examples.orders_service import create_app as create_orders_app


def create_app() -> FastAPI:
    app = create_orders_app(os.environ["ORDERS_TOPIC"], os.environ["ORDERS_GROUP"])

    @app.get("/pending")
    async def pending(request: Request) -> int:
        # The test's signal to send SIGTERM: every caller is waiting in a purgatory, not on its way.
        return sum(p.num_delayed() for p in request.app.state.kp.purgatories.values())

    return app
