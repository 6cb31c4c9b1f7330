"""The host side of the runtime loop: schedule, then gate, one batch at a time.

Each batch is scheduled against the state the earlier batches left (the only allocator),
then the gate decides it from the runtime state it holds (enabled set, ceiling, kill
switches tripped so far). Ranks then plan and run it; what they report can trip a switch
before the next batch is decided, and a batch that failed on every rank's agreement trips
one before it is decided again (``recovery.recover``). ``explain`` drives the same loop
without tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import BatchSpec, ScheduledBatch, Scheduler
from cpkv_core.runtime import ShadowOutcome, ShadowPlan
from phases import BatchPlan, Gate, PhaseId
from phases.shadow import sampled

SHADOWED = (
    PhaseId.COMPUTE_OWNER_WRITE,
    PhaseId.PAGE_ALIGNED_SPLIT,
    PhaseId.CURRENT_REUSE,
    PhaseId.NARROW_OUTPUT,
)
"""Phases a shadow comparison checks, highest first (phase 2 changes KV at rest: its
fallback cannot run on the same pools)."""


@dataclass(frozen=True, slots=True)
class LoopStep:
    """One batch as the loop committed it: what was scheduled, what the gate decided and,
    when sampled, what the shadow comparison checks."""

    scheduled: ScheduledBatch
    decision: BatchPlan
    shadow: ShadowPlan | None = None


class HostLoop:
    """Scheduler and gate of one run."""

    def __init__(
        self,
        deploy: DeploymentConfig,
        enabled: frozenset[PhaseId],
        num_pages: int,
        ceiling: int | None = None,
        shadow_rate: float = 0.0,
        shadow_seed: int = 0,
    ) -> None:
        self.gate = Gate(enabled, deploy, ceiling)
        self.scheduler = Scheduler(num_pages, deploy.page_size, deploy.cp_size)
        self.shadow_rate, self.shadow_seed = shadow_rate, shadow_seed

    def step(self, batch: BatchSpec) -> LoopStep:
        """Schedules ``batch`` (allocating by compute owner when phase 5 may take it), has
        the gate decide it and, when sampled, plans its shadow comparison."""
        scheduled = self.scheduler.schedule(batch, self.gate.owner_policy())
        decision = self.gate.decide(scheduled)
        if not sampled(scheduled.batch, self.shadow_rate, self.shadow_seed):
            return LoopStep(scheduled, decision)
        phases = tuple(p for p in SHADOWED if decision.decisions[p - 1].active)
        plans = {
            frozenset(int(p) for p in off): self.gate.decide(scheduled, frozenset(off)).plan
            for size in range(len(phases) + 1)
            for off in combinations(phases, size)
        }
        return LoopStep(scheduled, decision, ShadowPlan(tuple(map(int, phases)), plans))

    def rollback(self, batch: int) -> None:
        """Undoes ``batch``, the last one stepped, after its run failed on some rank: the
        scheduler is as before it (the gate's state changes only on ``report``)."""
        self.scheduler.rollback(batch)

    def report(self, batch: int, outcome: ShadowOutcome | None) -> None:
        """Trips the kill switch of every phase the batch's shadow comparison caught."""
        for miss in outcome.mismatches if outcome is not None else ():
            diff = "inf" if miss.max_abs_diff == float("inf") else f"{miss.max_abs_diff:.3g}"
            self.gate.kill(PhaseId(miss.phase), (("batch", batch), ("max_diff", diff)))
