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
from typing import ClassVar, Literal, Self

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning import ExecutionPlan, ScheduledBatch, SplitStrategy, is_short_page_count
from phases.base import StartupContract
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class PageAlignedSplitStartup(StartupContract):
    """Page alignment cuts zigzag segments; round-robin has no segments to align."""

    cp_mode: Literal[CpMode.IN_SEQ_SPLIT]
    """needs in-seq-split (zigzag): round-robin has no segments to align"""

    @classmethod
    def from_deployment(cls, deploy: DeploymentConfig) -> Self:
        """See ``StartupContract.from_deployment``."""
        return cls.model_validate({"cp_mode": deploy.cp_mode})


def short_request_reasons(batch: ScheduledBatch, code: ReasonCode) -> list[Reason]:
    """``code rid=.. pages=.. need=..`` for every request too short for the page-aligned
    split (the rule is ``split_page_aligned.is_short_page_count``)."""
    need = 2 * batch.cp_size
    return [
        Reason(code, (("rid", req.rid), ("pages", pages), ("need", need)))
        for req, pages in zip(batch.requests, batch.current_pages, strict=True)
        if is_short_page_count(pages, batch.cp_size)
    ]


class PageAlignedSplit:
    """Phase 4; see the module docstring."""

    id: PhaseId = PhaseId.PAGE_ALIGNED_SPLIT
    needs: tuple[PhaseId, ...] = (PhaseId.SHARDED_KV,)
    # NOTE: an unsplit batch (CP_OFF) has no segments to align.
    needs_split: bool = True
    startup_contract: ClassVar[type[StartupContract]] = PageAlignedSplitStartup
    summary: str = "cut the zigzag split at page boundaries: one compute owner per page"

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        """Refuses batches with short requests, naming each."""
        return short_request_reasons(batch, ReasonCode.SHORT_REQUEST)

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Swaps the token-balanced zigzag for the page-aligned one."""
        return dataclasses.replace(plan, split=SplitStrategy.PAGE_ALIGNED_ZIGZAG)
