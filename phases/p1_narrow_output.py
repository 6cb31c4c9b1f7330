"""Phase 1, narrow output: the tail gathers only each request's last-token hidden state.

Instead of all-gathering ``num_tokens x hidden`` at the tail, every rank contributes a
``bs x hidden`` buffer holding the last-token states of the requests whose last token it
computed, so the tail moves ``cp_size x bs x hidden``. Batches that need every hidden state
(speculative decoding, ``return_logprob``, ``capture_hidden``) keep the full gather.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import ExecutionPlan, OutputStrategy
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class NarrowOutputStartup(BaseModel):
    """Phase 1 works with any CP deployment: both split modes know each last token's rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cp_size: int = Field(ge=1)
    """CP ranks; 1 still narrows (``bs x hidden`` instead of ``num_tokens x hidden``)."""
    cp_mode: CpMode
    """Either split mode: zigzag (owner of the last non-empty segment) or round-robin."""


class NarrowOutput:
    """Phase 1; see the module docstring."""

    id: PhaseId = PhaseId.NARROW_OUTPUT
    needs: tuple[PhaseId, ...] = ()
    startup_contract: type[BaseModel] = NarrowOutputStartup
    summary: str = "gather only each request's last-token hidden state at the tail"

    def check_batch(self, batch: BatchSpec, deploy: DeploymentConfig) -> list[Reason]:
        """Refuses batches that need every token's hidden state."""
        reasons = []
        if batch.spec is not None:
            reasons.append(Reason(ReasonCode.SPEC_DECODE, f"spec={batch.spec}"))
        for req in batch.requests:
            if req.return_logprob:
                reasons.append(Reason(ReasonCode.RETURN_LOGPROB, f"rid={req.rid}"))
            if req.capture_hidden:
                reasons.append(Reason(ReasonCode.CAPTURE_HIDDEN, f"rid={req.rid}"))
        return reasons

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Swaps the full tail gather for the last-token gather."""
        return dataclasses.replace(plan, output=OutputStrategy.NARROW_LAST_TOKEN)
