"""``cpkv explain``: the gate's plan for every batch of a trace, and a summary by phase."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpkv.common.console import BadInput
from cpkv.run.loop import HostLoop
from cpkv.run.phase_mix import PhaseMix, phase_mix
from cpkv.run.reason_codes import count_codes
from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import BatchSpec, pages_for_trace
from cpkv_core.planning.chunking import mid_page_warning
from cpkv_core.runtime import FailureCause
from phases import BatchPlan, PhaseId

CAUSES = tuple(str(c) for c in FailureCause)
"""What ``--killed PHASE@BATCH:CAUSE`` takes."""


def plan_to_json(plan: BatchPlan) -> dict[str, Any]:
    """The strategies and per-phase decisions of one ``BatchPlan``; ``cp_off`` is the
    ``CP_OFF`` reason of a batch that runs unsplit, else null."""
    return {
        "phase": plan.phase,
        "cp_off": None if plan.cp_off is None else plan.cp_off.to_json(),
        "plan": {
            "split": str(plan.plan.split),
            "kv_write": str(plan.plan.kv_write),
            "kv_read": str(plan.plan.kv_read),
            "output": str(plan.plan.output),
        },
        "phases": [
            {
                "phase": int(d.phase),
                "active": d.active,
                "reasons": [str(r) for r in d.reasons],
                "codes": [str(r.code) for r in d.reasons],
            }
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
    killed: tuple[ReplayedKill, ...] = ()
    """Kill switches replayed with ``--killed``."""
    warnings: tuple[str, ...] = ()
    """What the trace does that the server would not (``sharded_trace_warnings``)."""

    def mix(self) -> PhaseMix:
        """The share of batches and tokens per phase, and fallback codes per enabled phase."""
        return phase_mix(self.batches, self.plans, self.enabled)

    def summary(self) -> dict[str, Any]:
        """Batches and tokens per chosen phase, reason codes counted per phase, and the
        phase mix (shares and fallbacks)."""
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
        } | self.mix().to_json()

    def to_json(self, summary_only: bool = False) -> dict[str, Any]:
        """The stable JSON document of ``cpkv explain --json``; ``summary_only`` leaves out
        the per-batch plans (``--summary``)."""
        document: dict[str, Any] = {
            "deployment": self.deploy.model_dump(mode="json"),
            "enabled": sorted(int(p) for p in self.enabled),
            "ceiling": self.ceiling,
            "killed": [
                {"phase": int(k.phase), "batch": k.batch, "cause": k.cause} for k in self.killed
            ],
            "warnings": list(self.warnings),
        }
        if not summary_only:
            document["batches"] = [
                {"batch": b.batch, "tokens": b.num_tokens, "requests": len(b.requests)}
                | plan_to_json(plan)
                for b, plan in zip(self.batches, self.plans, strict=True)
            ]
        return document | {"summary": self.summary()}


@dataclass(frozen=True, slots=True)
class ReplayedKill:
    """A kill switch to trip while explaining (``--killed``): ``phase`` after batch
    ``batch`` (a shadow kill), or before it when ``cause`` names a failed batch's kill."""

    phase: PhaseId
    batch: int
    cause: str | None = None
    """``error``, ``debug_check`` or ``nonfinite``: the batch failed in the phase's path
    and was rerun without it; None: a shadow mismatch (the batch was served)."""


def parse_killed(texts: Sequence[str], batches: Sequence[BatchSpec]) -> tuple[ReplayedKill, ...]:
    """``PHASE@BATCH`` options as kills; BATCH must be a batch of the trace.

    Raises:
        BadInput: a malformed option, an unknown phase or a batch the trace lacks.
    """
    numbers = {b.batch for b in batches}
    kills = []
    for text in texts:
        phase_text, at, rest = text.partition("@")
        batch_text, colon, cause = rest.partition(":")
        if not (at and phase_text.strip().isdigit() and batch_text.strip().lstrip("-").isdigit()):
            raise BadInput(f"--killed takes PHASE@BATCH[:CAUSE] (e.g. 5@3), got {text!r}")
        if int(phase_text) not in {int(p) for p in PhaseId}:
            raise BadInput(f"--killed {text}: PHASE must be 1..5, got {int(phase_text)}")
        if int(batch_text) not in numbers:
            raise BadInput(f"--killed {text}: the trace has no batch {int(batch_text)}")
        if colon and cause not in CAUSES:
            raise BadInput(f"--killed {text}: CAUSE must be {', '.join(CAUSES)}, got {cause!r}")
        kill = ReplayedKill(PhaseId(int(phase_text)), int(batch_text), cause if colon else None)
        kills.append(kill)
    return tuple(kills)


def explain_trace(
    batches: Sequence[BatchSpec],
    enabled: frozenset[PhaseId],
    deploy: DeploymentConfig,
    ceiling: int | None = None,
    killed: Sequence[ReplayedKill] = (),
) -> ExplainReport:
    """Drives the runtime loop (schedule, gate) over ``batches`` without tensors.

    ``killed`` replays kill switches a live run tripped (explain runs no tensors, so it
    cannot find a mismatch or a failure itself): a shadow kill once its batch is decided,
    as the shadow verdict of that batch would, and later batches show ``KILLED batch=N``;
    a failed batch's kill before its batch is scheduled, as the rerun was, and that batch
    on shows ``KILLED cause=error batch=N``.
    """
    loop = HostLoop(
        deploy, enabled, pages_for_trace(batches, deploy.page_size, deploy.cp_size), ceiling
    )
    plans = []
    for batch in batches:
        for kill in killed:
            if kill.batch == batch.batch and kill.cause is not None:
                values = (("cause", kill.cause), ("batch", kill.batch), ("replayed", "--killed"))
                loop.gate.kill(kill.phase, values)
        plans.append(loop.step(batch).decision)
        for kill in killed:
            if kill.batch == batch.batch and kill.cause is None:
                loop.gate.kill(kill.phase, (("batch", kill.batch), ("replayed", "--killed")))
    warnings = sharded_trace_warnings(batches, enabled, deploy)
    return ExplainReport(
        deploy, enabled, ceiling, tuple(batches), tuple(plans), tuple(killed), warnings
    )


def sharded_trace_warnings(
    batches: Sequence[BatchSpec], enabled: frozenset[PhaseId], deploy: DeploymentConfig
) -> tuple[str, ...]:
    """With sharded KV (phase 2) enabled, a warning when the trace resumes chunks mid-page."""
    if PhaseId.SHARDED_KV not in enabled:
        return ()
    warning = mid_page_warning(batches, deploy.page_size)
    return () if warning is None else (warning,)
