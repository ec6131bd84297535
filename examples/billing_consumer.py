"""The consumer side: a ``billing`` consumer group that processes orders and commits each one.

Plain confluent-kafka: subscribe, process, commit synchronously *after* processing — so a
committed offset means "processed", which is what ``GET /orders/wait`` (``wait_committed``)
waits for. Run it next to ``examples.orders_service``::

    python -m examples.billing_consumer            # PURGATORY_KAFKA_BOOTSTRAP names the cluster
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException

from purgatory.settings import load_settings

POLL_S = 0.2  # how long one poll waits; also how quickly `stop` is noticed


def consume(
    bootstrap_servers: str,
    topic: str = "orders",
    group: str = "billing",
    *,
    process: Callable[[dict[str, Any]], None] = print,
    stop: threading.Event | None = None,
    max_records: int | None = None,
) -> int:
    """Process records until ``stop`` is set or ``max_records`` were processed; return the count."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,  # commit after processing, never before
        }
    )
    consumer.subscribe([topic])
    processed = 0
    try:
        while not (stop is not None and stop.is_set()) and (max_records is None or processed < max_records):
            message = consumer.poll(POLL_S)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            process(json.loads(message.value() or b"{}"))
            consumer.commit(message=message, asynchronous=False)  # commits message.offset() + 1
            processed += 1
    finally:
        consumer.close()
    return processed


if __name__ == "__main__":
    servers = load_settings().kafka.bootstrap_servers
    if not servers:
        raise SystemExit("set PURGATORY_KAFKA_BOOTSTRAP (printed by `purgatory kafka up`)")
    consume(servers)
