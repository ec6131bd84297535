"""Kafka adapters."""
