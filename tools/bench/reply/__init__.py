"""Request-reply over Kafka: latency against a hand-rolled client (``request_reply``, ``purgatory
bench request-reply``) and the per-stage trace of one request (``trace``)."""
