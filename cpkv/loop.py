"""The host side of the runtime loop: schedule, then gate, one batch at a time.

Each batch is scheduled against the state the earlier batches left (the only allocator),
then the gate decides it from the runtime state it holds (enabled set, ceiling, kill
switches tripped so far). Ranks then plan and run it; what they report can trip a switch
before the next batch is decided. ``explain`` drives the same loop without tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import BatchSpec, ScheduledBatch, Scheduler
from phases import BatchPlan, Gate, PhaseId


@dataclass(frozen=True, slots=True)
class LoopStep:
    """One batch as the loop committed it: what was scheduled and what the gate decided."""

    scheduled: ScheduledBatch
    decision: BatchPlan


class HostLoop:
    """Scheduler and gate of one run."""

    def __init__(
        self,
        deploy: DeploymentConfig,
        enabled: frozenset[PhaseId],
        num_pages: int,
        ceiling: int | None = None,
    ) -> None:
        self.gate = Gate(enabled, deploy, ceiling)
        self.scheduler = Scheduler(num_pages, deploy.page_size, deploy.cp_size)

    def step(self, batch: BatchSpec) -> LoopStep:
        """Schedules ``batch`` (allocating by compute owner when phase 5 may take it) and
        has the gate decide it."""
        scheduled = self.scheduler.schedule(batch, self.gate.owner_policy())
        return LoopStep(scheduled, self.gate.decide(scheduled))
