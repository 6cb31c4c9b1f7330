"""``cpkv explain``: the gate's plan for every batch of a trace, and a summary by phase."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpkv.reason_codes import count_codes
from cpkv_core.batch import BatchSpec
from cpkv_core.config import DeploymentConfig
from phases.gate import BatchPlan, Gate, plan_trace
from phases.ids import PhaseId


def plan_to_json(plan: BatchPlan) -> dict[str, Any]:
    """The strategies and per-phase decisions of one ``BatchPlan``."""
    return {
        "phase": plan.phase,
        "plan": {
            "split": str(plan.plan.split),
            "kv_write": str(plan.plan.kv_write),
            "kv_read": str(plan.plan.kv_read),
            "output": str(plan.plan.output),
        },
        "phases": [
            {"phase": int(d.phase), "active": d.active, "reasons": list(d.reasons)}
            for d in plan.decisions
        ],
    }


@dataclass(frozen=True, slots=True)
class ExplainReport:
    """Every batch's plan under one deployment and enabled set."""

    deploy: DeploymentConfig
    enabled: frozenset[PhaseId]
    ceiling: int | None
    batches: tuple[BatchSpec, ...]
    plans: tuple[BatchPlan, ...]

    def summary(self) -> dict[str, Any]:
        """Batches and tokens per chosen phase, and reason codes counted per phase."""
        batches: Counter[int] = Counter()
        tokens: Counter[int] = Counter()
        reasons: dict[int, Counter[str]] = {int(p): Counter() for p in PhaseId}
        for batch, plan in zip(self.batches, self.plans, strict=True):
            batches[plan.phase] += 1
            tokens[plan.phase] += batch.num_tokens
            for decision in plan.decisions:
                reasons[int(decision.phase)].update(count_codes(decision.reasons))
        return {
            "batches_by_phase": {str(k): v for k, v in sorted(batches.items())},
            "tokens_by_phase": {str(k): v for k, v in sorted(tokens.items())},
            "reasons_by_phase": {str(k): dict(sorted(v.items())) for k, v in reasons.items()},
        }

    def to_json(self) -> dict[str, Any]:
        """The stable JSON document of ``cpkv explain --json``."""
        return {
            "deployment": self.deploy.model_dump(mode="json"),
            "enabled": sorted(int(p) for p in self.enabled),
            "ceiling": self.ceiling,
            "batches": [
                {"batch": b.batch, "tokens": b.num_tokens, "requests": len(b.requests)}
                | plan_to_json(plan)
                for b, plan in zip(self.batches, self.plans, strict=True)
            ],
            "summary": self.summary(),
        }


def explain_trace(
    batches: Sequence[BatchSpec],
    enabled: frozenset[PhaseId],
    deploy: DeploymentConfig,
    ceiling: int | None = None,
) -> ExplainReport:
    """Runs the gate over ``batches``; touches no tensor."""
    plans = plan_trace(Gate(enabled, deploy, ceiling), batches)
    return ExplainReport(deploy, enabled, ceiling, tuple(batches), plans)
