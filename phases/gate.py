"""The runtime gate: picks the highest eligible phase per batch, with every reason for the rest.

It decides one ``ScheduledBatch`` at a time from the runtime state it holds: the enabled set,
the ceiling, the start-up contracts (validated once, here) and the kill switches tripped so
far. It first decides whether the batch is split at all (``cp_off``: a batch SGLang 0.5.23
would not split, or one below the deployment's ``cp_min_tokens``, runs unsplit, and phases
that need a split are off for it).
Everything that does not depend on the batch is settled at construction or when a
switch trips, so a decision costs a few microseconds and formats no text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning import ExecutionPlan, OwnerPolicy, ScheduledBatch
from phases.base import Phase, check_startup
from phases.cp_off import cp_off_reason
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode, ReasonValue
from phases.registry import REGISTERED_PHASES


@dataclass(frozen=True, slots=True)
class PhaseDecision:
    """Whether one phase is active for a batch, and if not, every reason."""

    phase: PhaseId
    active: bool
    reasons: tuple[Reason, ...]

    @property
    def disabled(self) -> bool:
        """Off only because its flag is off (reports leave these out)."""
        return len(self.reasons) == 1 and self.reasons[0].code is ReasonCode.DISABLED


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The gate's answer for one batch."""

    phase: int
    """The highest active phase; 0 when none is active."""
    plan: ExecutionPlan
    decisions: tuple[PhaseDecision, ...]
    """One per phase 1..5, in order."""
    cp_off: Reason | None = None
    """``CP_OFF rule=sglang ...`` or ``CP_OFF tokens=.. min=..`` when the batch runs unsplit
    (the ``none`` split: every rank computes every token); None when it is split."""


_SHADOW_OFF = Reason(ReasonCode.KILLED, (("shadow", "fallback"),))
_NEEDS = {pid: Reason(ReasonCode.NEEDS_INACTIVE, (("phase", int(pid)),)) for pid in PhaseId}


class Gate:
    """Decides per batch which phases are active.

    A phase is active only if it is enabled, registered, under the ceiling, not killed, its
    start-up contract holds, every phase it needs is active for the batch, the batch is
    split when the phase needs a split (else ``CP_OFF``, and its batch contract is not
    asked), and its batch contract holds. Per batch the gate reads the scheduled batch's
    host metadata only.
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
        self.baseline = ExecutionPlan.baseline(deploy.cp_mode)
        self.killed: dict[PhaseId, Reason] = {}
        self._plans: dict[tuple[bool, tuple[PhaseId, ...]], ExecutionPlan] = {}
        """The plan of each (unsplit, active set) seen so far: at most 2 * 2**5, built once."""
        self._static = {pid: self._static_reasons(pid) for pid in PhaseId}

    def decide(
        self, batch: ScheduledBatch, switched_off: frozenset[PhaseId] = frozenset()
    ) -> BatchPlan:
        """The ``BatchPlan`` of ``batch``; ``switched_off`` phases are treated as killed for
        this decision only (a shadow comparison's fallback plans)."""
        cp_off = cp_off_reason(batch, self.deploy)
        active: list[PhaseId] = []
        decisions = []
        for pid in PhaseId:
            static, phase = self._static[pid], self.registry.get(pid)
            if pid in switched_off:
                decisions.append(PhaseDecision(pid, False, (_SHADOW_OFF,)))
                continue
            if phase is None or (static and static[0].code is ReasonCode.DISABLED):
                decisions.append(PhaseDecision(pid, False, static))
                continue
            reasons = [*static, *(_NEEDS[n] for n in phase.needs if n not in active)]
            if cp_off is not None and phase.needs_split:
                reasons.append(cp_off)
            else:
                reasons += phase.check_batch(batch, self.deploy)
            if not reasons:
                active.append(pid)
            decisions.append(PhaseDecision(pid, not reasons, tuple(reasons)))
        key = (cp_off is not None, tuple(active))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan_of(*key)
        return BatchPlan(int(active[-1]) if active else 0, plan, tuple(decisions), cp_off)

    def _plan_of(self, unsplit: bool, active: tuple[PhaseId, ...]) -> ExecutionPlan:
        """The baseline (split, or unsplit for a CP_OFF batch) with every active phase's
        strategies, in phase order."""
        plan = ExecutionPlan.unsplit() if unsplit else self.baseline
        for pid in active:
            plan = self.registry[pid].contribute(plan)
        return plan

    def owner_policy(self) -> OwnerPolicy:
        """How the scheduler should allocate the next batch when nothing but the batch itself
        stands in the way of the phases that care. In-seq: by compute owner when phase 5
        could be active. Round-robin: the page interleave computes each page on its owner
        whatever the allocation, so pages are dealt across the batch (``BATCH_DEALT``) when
        phase 4 could be active, which balances that split."""
        chain = [PhaseId.PAGE_ALIGNED_SPLIT, PhaseId.SHARDED_KV]
        interleave = self.deploy.cp_mode is CpMode.ROUND_ROBIN_SPLIT
        if not interleave:
            chain.append(PhaseId.COMPUTE_OWNER_WRITE)
        if not all(pid in self.registry and not self._static[pid] for pid in chain):
            return OwnerPolicy.DEALT
        return OwnerPolicy.BATCH_DEALT if interleave else OwnerPolicy.COMPUTE_OWNER

    def kill(self, phase: PhaseId, values: tuple[tuple[str, ReasonValue], ...]) -> None:
        """Trips ``phase``'s kill switch: it is inactive for every later batch, with a
        ``KILLED`` reason carrying ``values`` (e.g. the batch that tripped it)."""
        self.killed[phase] = Reason(ReasonCode.KILLED, values)
        self._static[phase] = self._static_reasons(phase)

    def _static_reasons(self, pid: PhaseId) -> tuple[Reason, ...]:
        """The reasons that do not depend on the batch."""
        if pid not in self.enabled:
            return (Reason(ReasonCode.DISABLED),)
        phase = self.registry.get(pid)
        if phase is None:
            return (Reason(ReasonCode.UNAVAILABLE),)
        reasons = check_startup(phase, self.deploy)
        if self.ceiling is not None and pid > self.ceiling:
            reasons.append(Reason(ReasonCode.CEILING, (("max_phase", self.ceiling),)))
        if pid in self.killed:
            reasons.append(self.killed[pid])
        return tuple(reasons)


def startup_problems(
    enabled: frozenset[PhaseId],
    deploy: DeploymentConfig,
    registry: Mapping[PhaseId, Phase] = REGISTERED_PHASES,
) -> dict[PhaseId, list[Reason]]:
    """Start-up contract failures of the enabled phases (validated once, here)."""
    return {pid: check_startup(registry[pid], deploy) for pid in sorted(enabled) if pid in registry}


def levels_of(enabled: frozenset[PhaseId]) -> tuple[int, ...]:
    """Levels a verify run covers: 0 up to the highest enabled phase."""
    return tuple(range(max(enabled, default=0) + 1))


def level_enabled(level: int, enabled: frozenset[PhaseId]) -> frozenset[PhaseId]:
    """The enabled phases a run at ``level`` hands its gate: those up to ``level``."""
    return frozenset(p for p in enabled if p <= level)
