"""Phase 5, compute-owner direct write: each rank writes its own KV into its own pool.

New pages are allocated to the rank that computes them (owner-aware allocation under
``owner = page % cp_size``: the allocator takes each page from that owner's free list), so
every rank writes the latent KV and index K/scale it computed straight into its pool. The
current chunk is all-gathered only when a read needs it (current reuse); history batches
materialize every page, the current ones included, from their owners.

A batch falls back to phase 4's gathered, owner-filtered write when its split is not
page-aligned (``NOT_PAGE_ALIGNED``) or when a page it writes is owned by another rank than
its compute owner (``OWNER_MISMATCH``): the classic case is a chunk resuming mid-page in a
page an earlier chunk left on another rank.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.execution import ExecutionPlan, KvWriteStrategy
from cpkv_core.planning.split_page_aligned import compute_owner_of_pages
from phases.ids import PhaseId
from phases.p4_page_aligned_split import short_request_reason
from phases.reasons import Reason, ReasonCode


class ComputeOwnerWriteStartup(BaseModel):
    """Direct writes add no start-up condition to phase 4's (in-seq split, sharded KV)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def owner_mismatch_reason(req: RequestSpec, deploy: DeploymentConfig) -> Reason | None:
    """A chunk resuming mid-page must resume in a page its first block's rank owns."""
    if req.prefix_len % deploy.page_size == 0:
        return None
    compute_owner = compute_owner_of_pages(
        [req.extend_len], [req.prefix_len], deploy.cp_size, deploy.page_size
    )[0][0]
    if req.first_page_owner == compute_owner:
        return None
    owner = "unknown" if req.first_page_owner is None else req.first_page_owner
    page = req.prefix_len // deploy.page_size
    return Reason(
        ReasonCode.OWNER_MISMATCH,
        f"rid={req.rid} page={page} owner={owner} compute_owner={compute_owner}",
    )


class ComputeOwnerWrite:
    """Phase 5; see the module docstring."""

    id: PhaseId = PhaseId.COMPUTE_OWNER_WRITE
    needs: tuple[PhaseId, ...] = (PhaseId.PAGE_ALIGNED_SPLIT,)
    startup_contract: type[BaseModel] = ComputeOwnerWriteStartup
    summary: str = "each rank writes the KV it computed into its own pool, no gather"

    def check_batch(self, batch: BatchSpec, deploy: DeploymentConfig) -> list[Reason]:
        """Refuses batches that are not page-aligned or write a foreign page."""
        reasons = []
        for req in batch.requests:
            reason = short_request_reason(req, deploy, ReasonCode.NOT_PAGE_ALIGNED)
            if reason is None:
                reason = owner_mismatch_reason(req, deploy)
            if reason is not None:
                reasons.append(reason)
        return reasons

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Direct writes from each rank's own projections."""
        return dataclasses.replace(plan, kv_write=KvWriteStrategy.COMPUTE_OWNER_DIRECT)
