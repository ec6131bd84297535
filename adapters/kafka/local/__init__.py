"""A local Apache Kafka cluster (KRaft) from Maven jars, no Docker: ``_maven.py`` resolves the
jars, ``_node.py`` is one node (its JVM, ports and files), ``_cluster.py`` lays out, formats,
starts, waits for and stops the nodes (see its docstring)."""

from ._cluster import (
    DEFAULT_HEAP_MB,
    FAST_START_JVM_OPTIONS,
    STATE_FILE,
    STEADY_STATE_JVM_OPTIONS,
    KafkaNode,
    LocalKafkaCluster,
    NodeSpec,
    NodeState,
    free_port,
    free_ports,
    voter_ids,
)
from ._maven import DEFAULT_KAFKA_VERSION, cache_dir, resolve_kafka

__all__ = [
    "DEFAULT_HEAP_MB",
    "DEFAULT_KAFKA_VERSION",
    "FAST_START_JVM_OPTIONS",
    "STATE_FILE",
    "STEADY_STATE_JVM_OPTIONS",
    "KafkaNode",
    "LocalKafkaCluster",
    "NodeSpec",
    "NodeState",
    "cache_dir",
    "free_port",
    "free_ports",
    "resolve_kafka",
    "voter_ids",
]
