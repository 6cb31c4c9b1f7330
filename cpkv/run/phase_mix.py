"""The phase mix of a trace: the share of batches and tokens each phase takes, the share that
runs unsplit (CP_OFF), and why enabled phases fell back, counted by reason code;
:func:`phase_mix`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv_core.planning import BatchSpec
from phases import BatchPlan, PhaseId


@dataclass(frozen=True, slots=True)
class PhaseShare:
    """How much of a trace one phase takes."""

    phase: int
    batches: int
    tokens: int
    batch_share: float
    """``batches`` over all batches."""
    token_share: float
    """``tokens`` over all current tokens."""

    def to_json(self) -> dict[str, Any]:
        """The share as in ``cpkv explain --json``'s summary."""
        return asdict(self)


CP_OFF_KEY = -1
"""Where unsplit (CP_OFF) batches are counted next to phases 0..5; no phase has it."""


@dataclass(frozen=True, slots=True)
class PhaseMix:
    """Shares for phases 0..5 and fallback codes of the enabled phases.

    Invariant: the shares' batches and tokens add up to ``batches`` and ``tokens``.
    """

    batches: int
    tokens: int
    shares: tuple[PhaseShare, ...]
    fallbacks: dict[int, dict[str, int]]
    """Enabled phase -> reason code -> batches in which the phase was off for it."""
    cp_off: PhaseShare
    """The batches that ran unsplit (CP_OFF), whatever their phase (``phase`` is
    ``CP_OFF_KEY``)."""

    def to_json(self) -> dict[str, Any]:
        """The keys ``cpkv explain`` adds to its summary."""
        cp_off = {k: v for k, v in self.cp_off.to_json().items() if k != "phase"}
        return {
            "batches": self.batches,
            "tokens": self.tokens,
            "shares": [share.to_json() for share in self.shares],
            "fallbacks": {str(p): codes for p, codes in self.fallbacks.items()},
            "cp_off": cp_off,
        }


def phase_mix(
    batches: Sequence[BatchSpec], plans: Sequence[BatchPlan], enabled: frozenset[PhaseId]
) -> PhaseMix:
    """The phase mix of ``plans``, the gate's plans for ``batches``."""
    batch_count: Counter[int] = Counter()
    token_count: Counter[int] = Counter()
    fallbacks: dict[int, Counter[str]] = {int(p): Counter() for p in sorted(enabled)}
    for batch, plan in zip(batches, plans, strict=True):
        batch_count[plan.phase] += 1
        token_count[plan.phase] += batch.num_tokens
        if plan.cp_off is not None:
            batch_count[CP_OFF_KEY] += 1
            token_count[CP_OFF_KEY] += batch.num_tokens
        for decision in plan.decisions:
            if decision.phase in enabled and not decision.active:
                fallbacks[int(decision.phase)].update({str(r.code) for r in decision.reasons})
    total_batches, total_tokens = len(plans), sum(b.num_tokens for b in batches)

    def share(phase: int) -> PhaseShare:
        return PhaseShare(
            phase,
            batch_count[phase],
            token_count[phase],
            batch_count[phase] / total_batches if total_batches else 0.0,
            token_count[phase] / total_tokens if total_tokens else 0.0,
        )

    shares = tuple(share(phase) for phase in range(len(PhaseId) + 1))
    codes = {p: dict(sorted(c.items())) for p, c in fallbacks.items()}
    return PhaseMix(total_batches, total_tokens, shares, codes, share(CP_OFF_KEY))
