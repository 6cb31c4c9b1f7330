"""Which phase a failed batch drops: the failure's decision points read against the gate.

A failure names the decision points where it was seen (a step that raised in the KV write,
a debug check of the rows read, ...). The phase behind a point is the one whose strategy
the plan runs there: the highest active phase whose switching off changes that point's
strategy (phase 5 for a direct write, 3 for a reused read, 4 for a page-aligned split, 1
for the narrow tail, 2 for an owner-filtered write or a materialized read). When no point
is named, every active phase is a suspect, highest first. A phase can be dropped for one
batch only when its fallback keeps the KV layout: phase 2's fallback needs a replicated
pool, which a sharded run does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cpkv_core.planning import DecisionPoint, ScheduledBatch
from phases.gate import BatchPlan, Gate
from phases.ids import PhaseId

__all__ = ["Suspects", "phase_behind", "suspects"]


def phase_behind(
    gate: Gate, batch: ScheduledBatch, decision: BatchPlan, point: DecisionPoint
) -> PhaseId | None:
    """The phase whose strategy ``decision`` runs at ``point``; None when it is phase 0's."""
    strategy = decision.plan.strategy(point)
    for d in reversed(decision.decisions):
        if not d.active:
            continue
        if gate.decide(batch, frozenset({d.phase})).plan.strategy(point) != strategy:
            return d.phase
    return None


@dataclass(frozen=True, slots=True)
class Suspects:
    """The phases a failure may be dropped for, highest first."""

    phases: tuple[PhaseId, ...]
    """Droppable suspects, highest first: drop the first, rerun, then the next."""
    attributed: bool
    """The failure named its points (the suspects are the phases behind them); False: it
    could not be told, and every active phase is a suspect."""
    kept: tuple[PhaseId, ...]
    """Suspects that cannot be dropped for a batch (their fallback changes KV at rest)."""


def suspects(
    gate: Gate, batch: ScheduledBatch, decision: BatchPlan, points: Iterable[DecisionPoint]
) -> Suspects:
    """The phases to drop for a failure of ``batch`` under ``decision`` seen at ``points``."""
    points = tuple(points)
    if points:
        behind = {phase_behind(gate, batch, decision, p) for p in points}
        named = sorted((p for p in behind if p is not None), reverse=True)
    else:
        named = sorted((d.phase for d in decision.decisions if d.active), reverse=True)
    layout = decision.plan.kv_layout
    droppable = [p for p in named if gate.decide(batch, frozenset({p})).plan.kv_layout is layout]
    kept = tuple(p for p in named if p not in droppable)
    return Suspects(tuple(droppable), bool(points), kept)
