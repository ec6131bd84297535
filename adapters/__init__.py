"""Integrations with outside systems, installed as ``purgatory.adapters``.

Shared by the adapters and the tools: :func:`copy_dependencies` resolves Maven artifacts (the
local Kafka, Spark's connector, the JVM side of the benchmarks) into a directory.
"""

from ._maven import MavenError, copy_dependencies

__all__ = ["MavenError", "copy_dependencies"]
