"""Spark adapters."""
