"""Phase 5, compute-owner direct write: each rank writes its own KV into its own pool.

New pages are allocated to the rank that computes them (the scheduler's compute-owner
policy under ``owner = page % cp_size``: it takes each page from that owner's free list), so
every rank writes the latent KV and index K/scale it computed straight into its pool. The
current chunk is all-gathered only when a read needs it (current reuse); history batches
materialize every page, the current ones included, from their owners.

In ``in-seq-split`` a batch falls back to phase 4's gathered, owner-filtered write when its
split is not page-aligned (``NOT_PAGE_ALIGNED``), when a page it writes is owned by another
rank than its compute owner (``OWNER_MISMATCH``: the classic case is a chunk resuming
mid-page in a page an earlier chunk left on another rank), or when its pages were dealt
(``NOT_OWNER_ALLOCATED``: compute-owner allocation was off when it was scheduled).

In ``round-robin-split`` phase 4's page interleave computes every page on its owner, whoever
placed it, so the direct write applies to every batch that takes it, chunks resuming
mid-page included: phase 5 adds no batch condition there (a batch that keeps the token
interleave shows ``NEEDS_INACTIVE phase=4``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning import (
    NO_OWNER,
    ExecutionPlan,
    KvWriteStrategy,
    ScheduledBatch,
    ScheduledRequest,
    compute_owner_of_pages,
    is_short_page_count,
)
from phases.base import StartupContract
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class ComputeOwnerWriteStartup(StartupContract):
    """Direct writes add no start-up condition to phase 4's and phase 2's, in either mode."""


def _owner_mismatch(req: ScheduledRequest, batch: ScheduledBatch) -> Reason | None:
    """A chunk resuming mid-page must resume in a page its first block's rank owns."""
    if req.resume_page_owner == NO_OWNER:
        return None
    compute_owner = compute_owner_of_pages(
        [req.extend_len], [req.prefix_len], batch.cp_size, batch.page_size
    )[0][0]
    if req.resume_page_owner == compute_owner:
        return None
    return Reason(
        ReasonCode.OWNER_MISMATCH,
        (
            ("rid", req.rid),
            ("page", req.prefix_len // batch.page_size),
            ("owner", req.resume_page_owner),
            ("compute_owner", compute_owner),
        ),
    )


class ComputeOwnerWrite:
    """Phase 5; see the module docstring."""

    id: PhaseId = PhaseId.COMPUTE_OWNER_WRITE
    needs: tuple[PhaseId, ...] = (PhaseId.PAGE_ALIGNED_SPLIT,)
    # NOTE: direct writes rest on one compute owner per page; unsplit, every rank computes
    # every page.
    needs_split: bool = True
    startup_contract: ClassVar[type[StartupContract]] = ComputeOwnerWriteStartup
    summary: str = "each rank writes the KV it computed into its own pool, no gather"

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        """In-seq: refuses batches that are not page-aligned, write a foreign page, or were
        dealt. Round-robin: nothing to refuse beyond phase 4's split."""
        # NOTE: the page interleave puts each page's tokens on the page's owner: compute
        # owner = storage owner for every page the batch writes, by construction.
        if deploy.cp_mode is CpMode.ROUND_ROBIN_SPLIT or batch.on_compute_owners:
            return []
        need = 2 * batch.cp_size
        reasons: list[Reason] = []
        for req, pages in zip(batch.requests, batch.current_pages, strict=True):
            if is_short_page_count(pages, batch.cp_size):
                values = (("rid", req.rid), ("pages", pages), ("need", need))
                reasons.append(Reason(ReasonCode.NOT_PAGE_ALIGNED, values))
            elif (mismatch := _owner_mismatch(req, batch)) is not None:
                reasons.append(mismatch)
        return reasons or [Reason(ReasonCode.NOT_OWNER_ALLOCATED)]

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Direct writes from each rank's own projections."""
        return dataclasses.replace(plan, kv_write=KvWriteStrategy.COMPUTE_OWNER_DIRECT)
