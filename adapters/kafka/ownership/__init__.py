"""Ownership: which instance of a scaled-out service serves which partition.

Partition ownership follows the consumer group's assignment (no election of our own); the
guard completes an operation with ``Moved`` when its partition changes owner while it waits.
"""
