"""The fault schedule of one chaos seed: which node (or the service) is hit, how, when, how long.

Drawn from ``random.Random(seed)`` alone, so a seed names its schedule: ``--seed S`` replays the
same faults in the same order at the same planned times (the load's interleaving differs, as in
Jepsen: the seed fixes the nemesis, not the scheduler).

One fault at a time, each healed before the next begins: with three KRaft voters and topics of
RF 3 / ``min.insync.replicas=2``, any one node down still leaves a quorum and enough in-sync
replicas, so the suite checks the promises that hold through a single failure (and answers
other than 200 stay the exception). A service bounce is a fault of its own in the same sequence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

__all__ = ["Fault", "FaultAction", "draw_schedule", "format_schedule"]

FaultAction = Literal["kill", "pause", "stop", "bounce"]

NODE_ACTIONS: tuple[FaultAction, ...] = ("kill", "pause", "stop")
NODE_ACTION_WEIGHTS = (0.45, 0.4, 0.15)  # crashes and freezes are the faults that break promises
SERVICE_SHARE = 0.25  # of the faults, how many bounce the service rather than hit a node
FIRST_FAULT_S = (1.0, 3.0)  # after the load has warmed up
HOLD_S = (1.0, 6.0)  # how long a node stays down or frozen (past the 3 s session timeout, or not)
GAP_S = (0.5, 3.0)  # healthy time between the heal of one fault and the next
LAST_FAULT_MARGIN_S = 2.0  # no fault starts this close to the end of the load


@dataclass(frozen=True)
class Fault:
    """One planned fault: at ``at_s`` (seconds into the load) do ``action`` to ``target`` (a
    node id, or ``None`` for the service), heal it ``hold_s`` later."""

    at_s: float
    target: int | None
    action: FaultAction
    hold_s: float

    @property
    def target_name(self) -> str:
        return "service" if self.target is None else f"node {self.target}"

    def describe(self) -> str:
        verb = {
            "kill": "SIGKILL, restart",
            "pause": "SIGSTOP, SIGCONT",
            "stop": "SIGTERM, restart",
            "bounce": "SIGTERM, restart",
        }[self.action]
        return (
            f"t={self.at_s:6.2f}s  {self.target_name:<8} {self.action:<6} ({verb} after {self.hold_s:.2f}s)"
        )


def draw_schedule(seed: int, duration_s: float, nodes: tuple[int, ...]) -> list[Fault]:
    """The faults of ``seed`` over a load of ``duration_s`` on a cluster of ``nodes``.

    Planned times assume each fault heals in ``hold_s``; a restart that takes longer pushes the
    rest back when run (the runner records the actual times next to the planned ones).
    """
    if not nodes:
        raise ValueError("nodes must name at least one node")
    rng = random.Random(seed)
    faults: list[Fault] = []
    t = rng.uniform(*FIRST_FAULT_S)
    while t < duration_s - LAST_FAULT_MARGIN_S:
        hold = round(rng.uniform(*HOLD_S), 2)
        if rng.random() < SERVICE_SHARE:
            fault = Fault(round(t, 2), None, "bounce", round(rng.uniform(0.2, 1.5), 2))
        else:
            action = rng.choices(NODE_ACTIONS, NODE_ACTION_WEIGHTS)[0]
            fault = Fault(round(t, 2), rng.choice(nodes), action, hold)
        faults.append(fault)
        t += fault.hold_s + rng.uniform(*GAP_S)
    return faults


def format_schedule(faults: list[Fault], actual: list[tuple[float, float]] | None = None) -> str:
    """One line per fault; with ``actual``, the times it really began and was healed."""
    lines = []
    for i, fault in enumerate(faults):
        line = f"  {fault.describe()}"
        if actual is not None and i < len(actual):
            began, healed = actual[i]
            line += f"  [ran {began:6.2f}s -> healed {healed:6.2f}s]"
        lines.append(line)
    return "\n".join(lines) if lines else "  (no faults)"
