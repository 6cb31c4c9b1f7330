"""Phase 4, page-aligned split: every current page has exactly one compute owner.

In ``in-seq-split`` the zigzag split is cut where the logical position (not the chunk
offset: a chunk may resume mid-page) is a multiple of ``page_size``. A batch with a request
whose current tokens span fewer than ``2 * cp_size`` pages keeps the token-balanced zigzag
(``SHORT_REQUEST``); the split is one per batch.

In ``round-robin-split`` the token interleave becomes a page interleave: the current tokens
of logical page ``p`` go to rank ``p % cp_size``, the page's storage owner, so the compute
owner is the storage owner by construction. A batch keeps the token interleave when the page
interleave would leave a rank idle or load the busiest rank beyond the balance rule
(``UNBALANCED``, ``balance.page_interleave_fits`` on the load the scheduler recorded,
``ScheduledBatch.owner_load``).

Either way segments hold unequal token counts; the engine groups local queries by their real
segment rows, never by half. The invariant "one compute owner per page" is what phase 5's
direct writes rest on.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from cpkv_core.config import CpMode, DeploymentConfig
from cpkv_core.planning import (
    PAGE_INTERLEAVE_MAX_IMBALANCE,
    ExecutionPlan,
    ScheduledBatch,
    SplitStrategy,
    is_short_page_count,
    page_interleave_fits,
)
from phases.base import StartupContract
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode

PAGE_ALIGNED_SPLITS = {
    SplitStrategy.ZIGZAG: SplitStrategy.PAGE_ALIGNED_ZIGZAG,
    SplitStrategy.ROUND_ROBIN: SplitStrategy.PAGE_INTERLEAVED,
}
"""The page-aligned split that replaces each mode's token-balanced split."""


class PageAlignedSplitStartup(StartupContract):
    """Both split modes have a page-aligned split: the zigzag cut at page boundaries
    (in-seq) and the page interleave (round-robin)."""


def short_request_reasons(batch: ScheduledBatch, code: ReasonCode) -> list[Reason]:
    """``code rid=.. pages=.. need=..`` for every request too short for the page-aligned
    zigzag (the rule is ``split_page_aligned.is_short_page_count``)."""
    need = 2 * batch.cp_size
    return [
        Reason(code, (("rid", req.rid), ("pages", pages), ("need", need)))
        for req, pages in zip(batch.requests, batch.current_pages, strict=True)
        if is_short_page_count(pages, batch.cp_size)
    ]


def unbalanced_reasons(batch: ScheduledBatch) -> list[Reason]:
    """``UNBALANCED pages=.. idle=.. tokens=.. work=.. bound=..`` when the page interleave
    breaks the balance rule; the ratios are the busiest rank's over the mean."""
    load = batch.owner_load
    if page_interleave_fits(load):
        return []
    values = (
        ("pages", sum(batch.current_pages)),
        ("idle", load.idle_ranks),
        ("tokens", f"{load.tokens_max_over_mean:.3f}"),
        ("work", f"{load.work_max_over_mean:.3f}"),
        ("bound", f"{PAGE_INTERLEAVE_MAX_IMBALANCE:.2f}"),
    )
    return [Reason(ReasonCode.UNBALANCED, values)]


class PageAlignedSplit:
    """Phase 4; see the module docstring."""

    id: PhaseId = PhaseId.PAGE_ALIGNED_SPLIT
    needs: tuple[PhaseId, ...] = (PhaseId.SHARDED_KV,)
    # NOTE: an unsplit batch (CP_OFF) has no segments to align.
    needs_split: bool = True
    startup_contract: ClassVar[type[StartupContract]] = PageAlignedSplitStartup
    summary: str = "cut the split at page boundaries or deal it by page: one compute owner per page"

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        """In-seq: refuses batches with short requests, naming each. Round-robin: refuses a
        batch the page interleave would leave unbalanced, with the figures."""
        if deploy.cp_mode is CpMode.ROUND_ROBIN_SPLIT:
            return unbalanced_reasons(batch)
        return short_request_reasons(batch, ReasonCode.SHORT_REQUEST)

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Swaps the mode's token-balanced split for its page-aligned one."""
        return dataclasses.replace(plan, split=PAGE_ALIGNED_SPLITS[plan.split])
