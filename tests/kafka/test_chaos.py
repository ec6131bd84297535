"""The randomized fault suite, short: two seeds of ~12 s on a 3-node cluster of three KRaft voters
(``purgatory bench chaos`` runs more, longer). Each seed kills, freezes and stops nodes —
controllers included — and bounces the service under mixed load (HTTP produces and long polls,
library commit waits and request-reply); the checker then reads every partition back and finds
no acknowledged record lost, duplicated or reordered, no long-poll answer that differs from the
log, no commit wait answered before its commit, no crossed reply, and no answer past its bound.

Bounded: the module's own cluster (started and stopped by PID here), each seed's service stopped
by PID by the runner, the whole module under its pytest timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from purgatory.adapters.kafka import LocalKafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

SEEDS = [1, 2]
SECONDS = 12.0


@pytest.fixture(scope="module")
def voters3() -> Iterator[LocalKafkaCluster]:
    """Three nodes, all controller voters (the launcher's default from three brokers up)."""
    cluster = LocalKafkaCluster(brokers=3)
    cluster.start()
    try:
        yield cluster
    finally:
        pids = [node.pid for node in cluster.nodes.values()]
        cluster.stop()
        assert not any(node.is_running() for node in cluster.nodes.values()), f"nodes {pids} outlived"


def test_random_faults_under_mixed_load_break_no_promise(voters3: LocalKafkaCluster) -> None:
    from purgatory.tools.reliability.chaos import run_seeds

    assert voters3.voters == (1, 2, 3)
    lines: list[str] = []
    results = run_seeds(SEEDS, SECONDS, cluster=voters3, echo=lines.append)
    print("\n".join(lines))
    assert [r.seed for r in results] == SEEDS
    for result in results:
        assert result.ok, "\n".join(lines)
        assert result.ran, f"seed {result.seed}: no fault ran"
        assert result.result.counts["produces"]["200"] > 0, f"seed {result.seed}: no produce answered 200"
        alive = [pid for pid in result.service_pids if Path(f"/proc/{pid}").exists()]
        assert not alive, f"seed {result.seed}: service process(es) {alive} outlived the seed"
    for node in voters3.nodes.values():
        assert node.state() == "running", f"node {node.node_id} left {node.state()} after the suite"
