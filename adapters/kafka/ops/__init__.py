"""Delayed operations: Kafka's fetch, produce, replication, commit and admin waits.

Each is a ``DelayedOperation`` of the core purgatory, completed by the facts of ``facts`` (the
feed's wake-ups) or expired by the timer; their typed results, and the off-loop variants that
complete on the event loop's thread, sit beside them.
"""
