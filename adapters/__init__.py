"""Integrations with outside systems, installed as ``purgatory.adapters``."""
