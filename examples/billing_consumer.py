"""The consumer side: a ``billing`` consumer group that processes orders and commits each one.

asyncio with aiokafka: subscribe, process, commit *after* processing — so a committed offset
means "processed", which is what ``GET /orders/wait`` (``wait_committed``) waits for. Run it next
to ``examples.orders_service``::

    python -m examples.billing_consumer            # PURGATORY_KAFKA_BOOTSTRAP names the cluster
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from purgatory.settings import load_settings

POLL_MS = 200  # how long one fetch waits; also how quickly `stop` is noticed


async def consume_async(
    bootstrap_servers: str,
    topic: str = "orders",
    group: str = "billing",
    *,
    process: Callable[[dict[str, Any]], None] = print,
    stop: threading.Event | None = None,
    max_records: int | None = None,
) -> int:
    """Process records until ``stop`` is set or ``max_records`` were processed; return the count."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap_servers,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,  # commit after processing, never before
    )
    await consumer.start()
    processed = 0

    def more() -> bool:
        return not (stop is not None and stop.is_set()) and (max_records is None or processed < max_records)

    try:
        while more():
            batches = await consumer.getmany(
                timeout_ms=POLL_MS, max_records=None if max_records is None else max_records - processed
            )
            for partition, messages in batches.items():
                for message in messages:
                    process(json.loads(message.value or b"{}"))
                    # The committed offset is the next one to read: past what was processed.
                    await consumer.commit(
                        {TopicPartition(partition.topic, partition.partition): message.offset + 1}
                    )
                    processed += 1
    finally:
        await consumer.stop()
    return processed


def consume(
    bootstrap_servers: str,
    topic: str = "orders",
    group: str = "billing",
    *,
    process: Callable[[dict[str, Any]], None] = print,
    stop: threading.Event | None = None,
    max_records: int | None = None,
) -> int:
    """:func:`consume_async` on its own event loop, for a thread or a script."""
    return asyncio.run(
        consume_async(bootstrap_servers, topic, group, process=process, stop=stop, max_records=max_records)
    )


if __name__ == "__main__":
    servers = load_settings().kafka.bootstrap_servers
    if not servers:
        raise SystemExit("set PURGATORY_KAFKA_BOOTSTRAP (printed by `purgatory kafka up`)")
    consume(servers)
