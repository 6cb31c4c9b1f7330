"""The runtime gate: picks the highest eligible phase per batch, with every reason for the rest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning.allocation import allocate_batch, pages_for_trace, with_first_page_owners
from cpkv_core.planning.allocator import PageAllocator
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import ExecutionPlan
from phases.base import Phase, check_startup
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode
from phases.registry import REGISTERED_PHASES


@dataclass(frozen=True, slots=True)
class PhaseDecision:
    """Whether one phase is active for a batch, and if not, every reason."""

    phase: PhaseId
    active: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The gate's answer for one batch."""

    phase: int
    """The highest active phase; 0 when none is active."""
    plan: ExecutionPlan
    decisions: tuple[PhaseDecision, ...]
    """One per phase 1..5, in order."""


class Gate:
    """Decides per batch which phases are active.

    A phase is active only if it is enabled, registered, under the ceiling, its start-up
    contract holds (checked once, here), every phase it needs is active for the batch, and
    its batch contract holds. Per batch the gate reads host metadata only.
    """

    def __init__(
        self,
        enabled: frozenset[PhaseId],
        deploy: DeploymentConfig,
        ceiling: int | None = None,
        registry: Mapping[PhaseId, Phase] = REGISTERED_PHASES,
    ) -> None:
        self.enabled = enabled
        self.deploy = deploy
        self.ceiling = ceiling
        self.registry = registry
        self.startup: dict[PhaseId, list[Reason]] = {
            pid: check_startup(phase, deploy) for pid, phase in registry.items()
        }
        self.baseline = ExecutionPlan.baseline(deploy.cp_mode)

    def plan(self, batch: BatchSpec) -> BatchPlan:
        """The ``BatchPlan`` of ``batch``."""
        active: set[PhaseId] = set()
        decisions = []
        plan = self.baseline
        for pid in PhaseId:
            reasons = self._reasons(pid, batch, active)
            if not reasons:
                active.add(pid)
                plan = self.registry[pid].contribute(plan)
            decisions.append(PhaseDecision(pid, not reasons, tuple(str(r) for r in reasons)))
        return BatchPlan(int(max(active, default=0)), plan, tuple(decisions))

    def _reasons(self, pid: PhaseId, batch: BatchSpec, active: set[PhaseId]) -> list[Reason]:
        phase = self.registry.get(pid)
        if pid not in self.enabled:
            return [Reason(ReasonCode.DISABLED)]
        if phase is None:
            return [Reason(ReasonCode.UNAVAILABLE)]
        reasons = list(self.startup[pid])
        if self.ceiling is not None and pid > self.ceiling:
            reasons.append(Reason(ReasonCode.CEILING, f"max_phase={self.ceiling}"))
        reasons += [
            Reason(ReasonCode.NEEDS_INACTIVE, f"phase={int(need)}")
            for need in phase.needs
            if need not in active
        ]
        return reasons + phase.check_batch(batch, self.deploy)


def startup_problems(
    enabled: frozenset[PhaseId],
    deploy: DeploymentConfig,
    registry: Mapping[PhaseId, Phase] = REGISTERED_PHASES,
) -> dict[PhaseId, list[str]]:
    """Start-up contract failures of the enabled phases (validated once, here)."""
    return {
        pid: [str(r) for r in check_startup(registry[pid], deploy)]
        for pid in sorted(enabled)
        if pid in registry
    }


def levels_of(enabled: frozenset[PhaseId]) -> tuple[int, ...]:
    """Levels a verify run covers: 0 up to the highest enabled phase."""
    return tuple(range(max(enabled, default=0) + 1))


def level_plans(
    level: int,
    enabled: frozenset[PhaseId],
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    ceiling: int | None = None,
) -> tuple[BatchPlan, ...]:
    """The gate's plans for ``batches`` at ``level``: the enabled phases up to ``level``."""
    return plan_trace(Gate(frozenset(p for p in enabled if p <= level), deploy, ceiling), batches)


def plan_trace(gate: Gate, batches: Sequence[BatchSpec]) -> tuple[BatchPlan, ...]:
    """The gate's plan for every batch of a trace, as a scheduler would make them.

    A host-only allocator follows the trace with the same policy as the ranks
    (``allocate_batch``), so each batch reaches the gate with the owner of the page it
    resumes in (``first_page_owner``), which phase 5's batch contract reads. No tensor.
    """
    deploy = gate.deploy
    num_pages = pages_for_trace(batches, deploy.page_size, deploy.cp_size)
    allocator = PageAllocator(num_pages, deploy.page_size, num_owners=deploy.cp_size)
    plans = []
    for batch in batches:
        plan = gate.plan(with_first_page_owners(batch, allocator))
        allocate_batch(allocator, batch, plan.plan)
        plans.append(plan)
    return tuple(plans)
