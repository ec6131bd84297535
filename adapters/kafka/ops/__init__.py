"""Delayed operations: Kafka's fetch, produce, replication, commit and admin waits.

Each is a ``DelayedOperation`` of the core purgatory, completed by the facts of ``facts`` (the
feed's wake-ups) or expired by the timer; their typed results sit beside them, and so do the
variants the HTTP service uses: ``OffLoopFetch`` and ``OffLoopReplication`` (they never read
records on the event loop's thread), ``OwnedFetch`` and ``OwnedReplication`` (they also move
when a scaled-out partition does).
"""
