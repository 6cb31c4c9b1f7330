"""Phase 4, page-aligned split: the zigzag split cuts at page boundaries.

The zigzag split is cut where the logical position (not the chunk offset: a chunk may
resume mid-page) is a multiple of ``page_size``, so every current page has exactly one
compute owner, the invariant phase 5's direct writes rest on. Segments then hold unequal
token counts; the engine splits local queries by their real segment rows, never by half.
A batch with a request whose current tokens span fewer than ``2 * cp_size`` pages keeps the
token-balanced split (``SHORT_REQUEST``); the split is one per batch.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.execution import ExecutionPlan, SplitStrategy
from cpkv_core.planning.split_page_aligned import request_pages
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class PageAlignedSplitStartup(BaseModel):
    """Page alignment cuts zigzag segments; round-robin has no segments to align."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    cp_mode: Literal[CpMode.IN_SEQ_SPLIT]
    """needs in-seq-split (zigzag): round-robin has no segments to align"""


def short_request_reason(
    req: RequestSpec, deploy: DeploymentConfig, code: ReasonCode
) -> Reason | None:
    """``code rid=.. pages=.. need=..`` when ``req`` spans fewer than ``2 * cp_size`` pages."""
    pages = request_pages(req.prefix_len, req.extend_len, deploy.page_size)
    need = 2 * deploy.cp_size
    return Reason(code, f"rid={req.rid} pages={pages} need={need}") if 0 < pages < need else None


class PageAlignedSplit:
    """Phase 4; see the module docstring."""

    id: PhaseId = PhaseId.PAGE_ALIGNED_SPLIT
    needs: tuple[PhaseId, ...] = (PhaseId.SHARDED_KV,)
    startup_contract: type[BaseModel] = PageAlignedSplitStartup
    summary: str = "cut the zigzag split at page boundaries: one compute owner per page"

    def check_batch(self, batch: BatchSpec, deploy: DeploymentConfig) -> list[Reason]:
        """Refuses batches with short requests, naming each."""
        reasons = (
            short_request_reason(r, deploy, ReasonCode.SHORT_REQUEST) for r in batch.requests
        )
        return [reason for reason in reasons if reason is not None]

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Swaps the token-balanced zigzag for the page-aligned one."""
        return dataclasses.replace(plan, split=SplitStrategy.PAGE_ALIGNED_ZIGZAG)
