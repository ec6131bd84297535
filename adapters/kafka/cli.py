"""``purgatory kafka up|down|status``: a local Apache Kafka cluster that outlives the command.

``purgatory kafka stop-node|start-node|kill-node|pause-node|resume-node N``: one node of it, by
PID (SIGTERM, a restart, SIGKILL, SIGSTOP, SIGCONT) — the faults a test wants to inject.

``purgatory kafka owners --group G``: which instance of a scaled-out service owns which
partitions (DescribeConsumerGroups of the ownership group: members, their URLs, assignments).

``up`` starts the cluster detached (its JVMs run in their own sessions) and records PIDs and
ports in ``<cache>/clusters/<name>/state.json``; ``down``, ``status`` and the node commands
read that file (the node commands write it back), so they work from any other process or
terminal.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from .clients._errors import KafkaAdapterError, NoLocalClusterError, UnknownNodeError
from .local import DEFAULT_HEAP_MB, STATE_FILE, LocalKafkaCluster, cache_dir

__all__ = ["app"]

app = typer.Typer(
    help="A local Apache Kafka cluster (KRaft, no Docker) for development.", no_args_is_help=True
)

NameOption = Annotated[str, typer.Option("--name", help="Which local cluster (several may coexist).")]
NodeArgument = Annotated[int, typer.Argument(help="Node id, as `purgatory kafka status` lists them.")]

# Exit codes of the node commands: a usage error (an unknown node id) is 2, as typer's own.
EXIT_FAILED, EXIT_USAGE = 1, 2


def _work_dir(name: str) -> Path:
    return cache_dir() / "clusters" / name


def _running(name: str) -> LocalKafkaCluster | None:
    work_dir = _work_dir(name)
    if not (work_dir / STATE_FILE).is_file():
        return None
    cluster = LocalKafkaCluster.from_state(work_dir)
    return cluster if any(True for _ in cluster.running_nodes()) else None


@app.command("up")
def up(
    brokers: Annotated[int, typer.Option("--brokers", "-b", min=1, max=9, help="Number of brokers.")] = 1,
    name: NameOption = "default",
    heap_mb: Annotated[
        int, typer.Option("--heap-mb", min=128, help="Max heap per broker JVM.")
    ] = DEFAULT_HEAP_MB,
    version: Annotated[str | None, typer.Option("--version", help="Apache Kafka version.")] = None,
) -> None:
    """Start a local cluster (resolving Kafka with Maven on first use) and print its bootstrap servers."""
    existing = _running(name)
    if existing is not None:
        typer.echo(f"already running: {existing.bootstrap_servers}")
        typer.echo(f"export PURGATORY_KAFKA_BOOTSTRAP={existing.bootstrap_servers}")
        return
    work_dir = _work_dir(name)
    shutil.rmtree(work_dir, ignore_errors=True)  # a stale, stopped cluster of the same name
    cluster = LocalKafkaCluster(brokers, version=version, work_dir=work_dir, heap_mb=heap_mb, detach=True)
    try:
        cluster.start()
    except KafkaAdapterError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"Kafka {cluster.version}, {brokers} broker(s), logs in {work_dir}")
    typer.echo(f"export PURGATORY_KAFKA_BOOTSTRAP={cluster.bootstrap_servers}")


@app.command("down")
def down(name: NameOption = "default") -> None:
    """Stop the local cluster by PID (SIGTERM, then SIGKILL after a bound) and remove its files."""
    work_dir = _work_dir(name)
    if not (work_dir / STATE_FILE).is_file():
        typer.echo(f"no local Kafka cluster named {name!r}")
        return
    cluster = LocalKafkaCluster.from_state(work_dir)
    cluster.stop()
    typer.echo(f"stopped local Kafka cluster {name!r}")


@app.command("status")
def status(name: NameOption = "default") -> None:
    """Show the cluster's nodes, PIDs and whether each is alive; exit 1 when it is not running."""
    work_dir = _work_dir(name)
    if not (work_dir / STATE_FILE).is_file():
        typer.echo(f"no local Kafka cluster named {name!r}")
        raise typer.Exit(1)
    cluster = LocalKafkaCluster.from_state(work_dir)
    alive = 0
    for node in cluster.nodes.values():
        state = node.state()
        alive += state != "stopped"
        role = "broker+controller" if node.spec.controller_port is not None else "broker"
        pid = node.pid if state != "stopped" else "-"
        typer.echo(f"node {node.node_id} ({role}) 127.0.0.1:{node.spec.broker_port} pid={pid} {state}")
    typer.echo(f"bootstrap: {cluster.bootstrap_servers}")
    if not alive:
        raise typer.Exit(1)


def _on_node(name: str, node_id: int, act: Callable[[LocalKafkaCluster, int], None], done: str) -> None:
    """Run ``act`` on node ``node_id`` of the cluster saved by ``up``; its errors as one line."""
    try:
        cluster = LocalKafkaCluster.from_state(_work_dir(name))
        cluster.node(node_id)  # an unknown id fails here, before anything is signalled
        act(cluster, node_id)
    except NoLocalClusterError:
        typer.echo(f"no local Kafka cluster named {name!r} (start one: purgatory kafka up)", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except UnknownNodeError as exc:
        typer.echo(f"local Kafka cluster {name!r}: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KafkaAdapterError as exc:  # a node not running (pause, resume), a failed restart
        typer.echo(f"local Kafka cluster {name!r}: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    typer.echo(f"node {node_id} {done}")


@app.command("stop-node")
def stop_node(node: NodeArgument, name: NameOption = "default") -> None:
    """Stop one node: SIGTERM (Kafka's controlled shutdown), SIGKILL after a bound."""
    _on_node(name, node, LocalKafkaCluster.stop_broker, "stopped")


@app.command("start-node")
def start_node(node: NodeArgument, name: NameOption = "default") -> None:
    """Start a stopped (or killed) node again and wait until the cluster lists it."""
    _on_node(name, node, LocalKafkaCluster.start_broker, "running")


@app.command("kill-node")
def kill_node(node: NodeArgument, name: NameOption = "default") -> None:
    """Kill one node with SIGKILL: a crash, no controlled shutdown."""
    _on_node(name, node, LocalKafkaCluster.kill_broker, "killed")


@app.command("pause-node")
def pause_node(node: NodeArgument, name: NameOption = "default") -> None:
    """Freeze one node with SIGSTOP: a hung broker, sockets open (resume-node undoes it)."""
    _on_node(name, node, lambda cluster, n: cluster.running_node(n).pause(), "paused")


@app.command("resume-node")
def resume_node(node: NodeArgument, name: NameOption = "default") -> None:
    """Resume a paused node with SIGCONT."""
    _on_node(name, node, lambda cluster, n: cluster.running_node(n).resume(), "resumed")


@app.command("owners")
def owners(
    group: Annotated[
        str | None, typer.Option("--group", help="Ownership group (default: scaleout.group_id).")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", help="Bootstrap servers (default: from settings).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show the members of a scaled-out service's ownership group, their URLs and partitions."""
    import json

    from purgatory.settings import load_settings

    from .clients._provider import BOOTSTRAP_ENV, configured_bootstrap
    from .ownership._owners import describe_owners

    settings = load_settings()
    servers = configured_bootstrap(settings.kafka, bootstrap)
    if not servers:
        typer.echo(f"no Kafka configured: pass --bootstrap or set {BOOTSTRAP_ENV}", err=True)
        raise typer.Exit(2)
    name = group or settings.scaleout.group_id
    try:
        snapshot = describe_owners(
            settings.kafka, name, bootstrap_servers=servers, scaleout=settings.scaleout
        )
    except Exception as exc:  # KafkaException and timeouts: one line, not a traceback
        typer.echo(f"could not describe group {name!r}: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        document = {
            "group": name,
            "state": snapshot.state,
            "members": [
                {
                    "url": m.url,
                    "member_id": m.member_id,
                    "host": m.host,
                    "partitions": sorted(k.label for k in m.partitions),
                    "trusted": m.trusted,
                }
                for m in snapshot.members
            ],
        }
        typer.echo(json.dumps(document, indent=2))
        return
    typer.echo(f"group {name}: {snapshot.state}, {len(snapshot.members)} member(s)")
    for member in snapshot.members:
        labels = ", ".join(sorted(k.label for k in member.partitions)) or "-"
        untrusted = "" if member.trusted else f"  UNTRUSTED: {member.distrust}"
        typer.echo(f"  {member.url}  ({len(member.partitions)} partitions)  {labels}{untrusted}")
