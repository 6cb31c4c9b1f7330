"""What the plugin decided, batch by batch: a structured record per batch
(:class:`DecisionRecord`) and running totals per phase and per reason (:class:`Totals`),
which the server log shows as one line (:meth:`Totals.line`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from phases import BatchPlan, PhaseId, ReasonCode
from phases.decision_log import DecisionRecord

__all__ = ["DecisionRecord", "TailFallback", "Totals", "record_of"]


class TailFallback:
    """Why the tail ran SGLang's own gather for a batch the gate gave phase 1 (codes as
    ``phases.ReasonCode``, for the cases only SGLang's code path shows)."""

    TUPLE_HIDDEN = "TUPLE_HIDDEN"
    """The model body returned a tuple (hidden states before the norm: DeepSeek-V4)."""
    AUX_HIDDEN = "AUX_HIDDEN"
    """The model captures aux hidden states (EAGLE-3, DSpark): they need every row."""
    PP_NOT_LAST = "PP_NOT_LAST"
    """Not the last pipeline rank: it hands every row to the next rank, no tail gather."""
    BREAKABLE_CUDA_GRAPH = "BREAKABLE_CUDA_GRAPH"
    """The tail runs inside breakable-CUDA-graph capture (``layers/cp/bcg``)."""
    ALL_POSITIONS = "ALL_POSITIONS"
    """The logits processor reads other positions than the last: multi-item or setwise
    scoring, diffusion LLM extend, LayerNorm SP's exit gather."""


def record_of(
    batch: int, tokens: int, requests: int, sglang_split: bool, plan: BatchPlan
) -> DecisionRecord:
    """The record of ``plan``; the batch is split when SGLang splits it and cpkv's gate gives
    it no ``CP_OFF`` reason."""
    reasons = [] if plan.cp_off is None else [str(plan.cp_off)]
    for decision in plan.decisions:
        if decision.active or decision.disabled:
            continue
        reasons += [
            f"{int(decision.phase)}:{reason}"
            for reason in decision.reasons
            if reason.code is not ReasonCode.CP_OFF
        ]
    split = sglang_split and plan.cp_off is None
    phase = plan.phase if split else 0
    return DecisionRecord(batch, tokens, requests, sglang_split, split, phase, tuple(reasons))


@dataclass(slots=True)
class Totals:
    """Running counts of one process's decisions, tail gathers and shadow checks."""

    batches: int = 0
    by_phase: Counter[int] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    """Reason codes: ``CP_OFF`` and ``N:CODE`` (``1:RETURN_LOGPROB``)."""
    tail: Counter[str] = field(default_factory=Counter)
    """``narrow`` and ``stock`` tail gathers, and ``stock:REASON`` for each fallback."""
    shadow: Counter[str] = field(default_factory=Counter)
    """``checked`` and ``mismatched`` shadow comparisons."""
    unreadable: int = 0
    """Forward batches cpkv could not read (SGLang's decision stood)."""

    def count(self, record: DecisionRecord) -> None:
        """Adds one decision."""
        self.batches += 1
        self.by_phase[record.phase] += 1
        for reason in record.reasons:
            self.by_reason[reason.split(" ", 1)[0]] += 1

    def line(self) -> str:
        """One log line: ``cpkv totals: 12 batches; phase 1: 10, 0: 2; reasons: ...``."""
        phases = ", ".join(f"{p}: {n}" for p, n in sorted(self.by_phase.items(), reverse=True))
        reasons = ", ".join(f"{code} {n}" for code, n in sorted(self.by_reason.items())) or "-"
        tail = ", ".join(f"{k} {n}" for k, n in sorted(self.tail.items())) or "-"
        shadow = ", ".join(f"{k} {n}" for k, n in sorted(self.shadow.items())) or "-"
        text = (
            f"cpkv totals: {self.batches} batches; phase {phases or '-'}; reasons: {reasons}; "
            f"tail: {tail}; shadow: {shadow}"
        )
        return text + (f"; unreadable: {self.unreadable}" if self.unreadable else "")


PLUGIN_PHASES = frozenset({PhaseId.NARROW_OUTPUT})
"""The phases whose batch decisions the plugin acts on in SGLang's code path."""
