"""The faces' named defaults and limits, each with its reason, and the operation type variable.

Shared by :class:`KafkaPurgatory` (``_service``), its parts (``_submission``, ``_request_reply``,
``_lifecycle``) and :class:`AsyncKafkaPurgatory` (``_async``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from ..clients._errors import UnknownTopicError
from ..facts._keys import TopicPartitionKey
from ..ops._fetch import DelayedFetch
from ..ops._metadata_waits import DelayedConsumerCommit, DelayedDeleteRecords, DelayedTopicReady
from ..ops._operations import KafkaOperation
from ..ops._produce import DelayedProduce
from ..ops._replication import DelayedReplication

__all__ = [
    "DEFAULT_REPLY_TOPIC",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "DRAIN_SIGNALS",
    "PURGATORY_NAMES",
    "SHUTDOWN_FLUSH_S",
]

Op = TypeVar("Op", bound=KafkaOperation)

# One purgatory per kind of operation, as the broker keeps one per request type ("Produce",
# "Fetch", "DeleteRecords"...): each gets its own delayedOperation label, timer and limits
# (settings [purgatories.<name>]). Any other KafkaOperation goes to the purgatory named by
# connect(name=...).
PURGATORY_NAMES: dict[type[KafkaOperation], str] = {
    DelayedProduce: "produce",
    DelayedReplication: "replication",
    DelayedFetch: "fetch",
    DelayedConsumerCommit: "commit",
    DelayedTopicReady: "topic_ready",
    DelayedDeleteRecords: "delete_records",
}
ADMIN_TIMEOUT_S = 30.0  # CreateTopics / DeleteRecords: a metadata round trip and the controller's work
# The async methods' pool: threads blocked at most a client timeout each, and the calls admitted.
ASYNC_CALL_THREADS, ASYNC_CALL_BACKLOG = 4, 1024
# Request-reply (issue 14): the reply topic of an instance group unless replies(topic=) names one,
# and the wait of a request that gives no timeout_ms.
DEFAULT_REPLY_TOPIC = "purgatory-replies"
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
REPLY_READY_TIMEOUT_S = 30.0  # first request: create the reply topic, join its group, position the tail
REQUEST_PURGATORY = "request"  # the delayedOperation label of requests waiting for replies
# At stop(), produces already handed to librdkafka get this long for their real delivery reports
# before the rest answer SHUTTING_DOWN: half of the 1 s in which every waiter is answered, and a
# delivered record answered as delivered is one a client will not send again.
SHUTDOWN_FLUSH_S = 0.5
# What drain_on_signals() listens to by default: what uvicorn, gunicorn and Kubernetes send.
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_Missing = tuple[list[TopicPartitionKey], UnknownTopicError]  # partitions that do not exist, and why
_SignalHandler = Callable[[int, FrameType | None], Any] | int | None
