"""Runnable examples of kafka-purgatory in a user's own code (each is exercised by a test)."""
