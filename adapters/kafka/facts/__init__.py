"""Partition facts: what the cluster looks like now, and who is waiting for it to change.

The keys that name partitions, topics and groups; the batched cluster view; the change feed
that polls the cluster and wakes the purgatories' watchers; the tail of appended records with
its offset index; the shared record cache; committed group offsets. Operations (``ops``) read
these facts to decide whether they can complete.
"""
