"""Where one rank writes a batch's current KV: of the batch's current tokens as runs by page
(``page_runs.PageRuns``), the runs this rank writes (every page when replicated, its own
pages when sharded, the tokens it computed under a compute-owner direct write)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.execution import ExecutionPlan, KvWriteStrategy
from cpkv_core.planning.ownership import local_page, owner_of_page
from cpkv_core.planning.page_runs import PageRuns
from cpkv_core.planning.scheduler import ScheduledBatch
from cpkv_core.planning.segments import SplitSegments

IntArray = npt.NDArray[np.int64]


def write_runs(
    batch: ScheduledBatch, plan: ExecutionPlan, rank: int, pages: PageRuns, segs: SplitSegments
) -> dict[str, IntArray]:
    """Per page run this rank writes: source row, pool row, logical loc, length."""
    ps, cp = batch.page_size, batch.cp_size
    if plan.kv_write is KvWriteStrategy.REPLICATED:
        dest = pages.page * ps + pages.offset
        return {
            "write_src0": pages.g0,
            "write_dst0": dest,
            "write_loc0": dest,
            "write_count": pages.count,
        }
    mine = owner_of_page(pages.page, cp) == rank
    page, g0, count, offset = (
        pages.page[mine],
        pages.g0[mine],
        pages.count[mine],
        pages.offset[mine],
    )
    src0 = g0
    if plan.kv_write is KvWriteStrategy.COMPUTE_OWNER_DIRECT:
        if segs.replicated:
            raise RuntimeError(
                f"batch {batch.batch}: a direct write under the none split, indicates a bug in "
                "the gate (phase 5 needs a split)"
            )
        ranks, src0 = segs.rank_of_tokens(g0)
        local = int(segs.num_local[rank])
        if not (ranks == rank).all() or int(count.sum()) != local:
            raise RuntimeError(
                f"batch {batch.batch}: rank {rank} computes tokens on pages it does not own, "
                "indicates a bug in the gate (OWNER_MISMATCH must fall back)"
            )
    dest = local_page(page, cp) * ps + offset
    return {
        "write_src0": src0,
        "write_dst0": dest,
        "write_loc0": page * ps + offset,
        "write_count": count,
    }
