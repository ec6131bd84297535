"""Which Kafka to use: an existing cluster, a testcontainers one, or the local launcher.

Provider order (docs/design.md §5): an existing cluster (:func:`configured_bootstrap`: an explicit
argument, ``PURGATORY_KAFKA_BOOTSTRAP``, or ``kafka.bootstrap_servers`` in the settings) →
testcontainers' Kafka module (KRaft) when a Docker engine answers → the project's local
launcher (:class:`LocalKafkaCluster`). The Docker check is a ``/_ping`` on the engine's
socket with a short timeout, so machines without Docker lose well under a second.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

import structlog

from ..local import DEFAULT_KAFKA_VERSION, LocalKafkaCluster
from ..settings import BOOTSTRAP_ENV, KafkaSettings

__all__ = [
    "BOOTSTRAP_ENV",
    "KafkaClusterHandle",
    "configured_bootstrap",
    "docker_available",
    "provide_cluster",
]

_log = structlog.get_logger("purgatory.kafka.provider")

DOCKER_PING_TIMEOUT_S = 0.5  # a local engine answers /_ping in milliseconds; absent ones fail fast
TESTCONTAINERS_IMAGE = f"apache/kafka:{DEFAULT_KAFKA_VERSION}"  # the same Kafka as the local launcher

Provider = Literal["existing", "testcontainers", "local"]


@dataclass
class KafkaClusterHandle:
    """A Kafka cluster to talk to, and how to stop it if we started it.

    ``local`` is the launcher when the cluster is ours (fault injection needs it); ``stop()``
    does nothing for an existing cluster.
    """

    bootstrap_servers: str
    provider: Provider
    local: LocalKafkaCluster | None = None
    _stop: Callable[[], None] | None = field(default=None, repr=False)

    def stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def configured_bootstrap(settings: KafkaSettings, bootstrap_servers: str | None = None) -> str | None:
    """The existing cluster meant, if any: ``bootstrap_servers``, then ``PURGATORY_KAFKA_BOOTSTRAP``,
    then ``settings.bootstrap_servers``; None when none names one.

    The one place of this order: the provider, the HTTP service (``resolve_bootstrap``),
    ``purgatory run``, ``purgatory kafka owners`` and ``purgatory analyze`` read it here, so they
    all agree on which cluster is meant (tests/repo/test_wiring.py keeps it the only one).
    """
    return bootstrap_servers or os.environ.get(BOOTSTRAP_ENV) or settings.bootstrap_servers


def docker_available(timeout_s: float = DOCKER_PING_TIMEOUT_S) -> bool:
    """True iff a Docker engine answers ``GET /_ping`` on its unix socket within ``timeout_s``."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return False  # remote engines: the user configures PURGATORY_KAFKA_BOOTSTRAP instead
    path = host.removeprefix("unix://")
    if not os.path.exists(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(256)
    except OSError:
        return False


def _testcontainers_cluster() -> KafkaClusterHandle | None:
    try:  # testcontainers >= 4.14 moved the module; older releases keep the first path
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        try:
            from testcontainers.kafka import KafkaContainer
        except ImportError:
            return None
    container = KafkaContainer(TESTCONTAINERS_IMAGE).with_kraft()
    container.start()
    return KafkaClusterHandle(container.get_bootstrap_server(), "testcontainers", None, container.stop)


def provide_cluster(
    settings: KafkaSettings | None = None,
    *,
    brokers: int = 1,
    use_existing: bool = True,
    use_docker: bool = True,
    **local_options: object,
) -> KafkaClusterHandle:
    """Return a running cluster, started if need be (see the module docstring for the order).

    ``brokers > 1`` or ``use_existing=False`` (fault tests that stop brokers) go straight to the
    local launcher, the only provider that can stop single brokers.
    """
    settings = settings or KafkaSettings()
    if use_existing and brokers == 1:
        existing = configured_bootstrap(settings)
        if existing:
            _log.info("kafka_provider", provider="existing", bootstrap=existing)
            return KafkaClusterHandle(existing, "existing")
    if use_docker and brokers == 1 and docker_available():
        handle = _testcontainers_cluster()
        if handle is not None:
            _log.info("kafka_provider", provider="testcontainers", bootstrap=handle.bootstrap_servers)
            return handle
    cluster = LocalKafkaCluster(brokers, **local_options)  # type: ignore[arg-type]
    cluster.start()
    _log.info("kafka_provider", provider="local", bootstrap=cluster.bootstrap_servers)
    return KafkaClusterHandle(cluster.bootstrap_servers, "local", cluster, cluster.stop)
