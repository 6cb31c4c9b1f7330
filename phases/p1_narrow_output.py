"""Phase 1, narrow output: the tail gathers only each request's last-token hidden state.

Instead of all-gathering ``num_tokens x hidden`` at the tail, every rank contributes a
``bs x hidden`` buffer holding the last-token states of the requests whose last token it
computed, so the tail moves ``cp_size x bs x hidden``. Batches that need every hidden state
(speculative decoding, ``return_logprob``, ``capture_hidden``) keep the full gather.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Self

from pydantic import Field

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning import ExecutionPlan, OutputStrategy, ScheduledBatch
from phases.base import StartupContract
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class NarrowOutputStartup(StartupContract):
    """Phase 1 works with any CP deployment: both split modes know each last token's rank."""

    cp_size: int = Field(ge=1)
    """CP ranks; 1 still narrows (``bs x hidden`` instead of ``num_tokens x hidden``)."""
    cp_mode: CpMode
    """Either split mode: zigzag (owner of the last non-empty segment) or round-robin."""

    @classmethod
    def from_deployment(cls, deploy: DeploymentConfig) -> Self:
        """See ``StartupContract.from_deployment``."""
        return cls(cp_size=deploy.cp_size, cp_mode=deploy.cp_mode)


class NarrowOutput:
    """Phase 1; see the module docstring."""

    id: PhaseId = PhaseId.NARROW_OUTPUT
    needs: tuple[PhaseId, ...] = ()
    # NOTE: an unsplit batch (CP_OFF) has every last token on every rank: no tail gather
    # to narrow.
    needs_split: bool = True
    startup_contract: ClassVar[type[StartupContract]] = NarrowOutputStartup
    summary: str = "gather only each request's last-token hidden state at the tail"

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        """Refuses batches that need every token's hidden state."""
        reasons = []
        if batch.spec is not None:
            reasons.append(Reason(ReasonCode.SPEC_DECODE, (("spec", batch.spec),)))
        for req in batch.requests:
            if req.return_logprob:
                reasons.append(Reason(ReasonCode.RETURN_LOGPROB, (("rid", req.rid),)))
            if req.capture_hidden:
                reasons.append(Reason(ReasonCode.CAPTURE_HIDDEN, (("rid", req.rid),)))
        return reasons

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Swaps the full tail gather for the last-token gather."""
        return dataclasses.replace(plan, output=OutputStrategy.NARROW_LAST_TOKEN)
