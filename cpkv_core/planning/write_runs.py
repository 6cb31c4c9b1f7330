"""Where one rank writes a batch's current KV: the batch's current tokens as runs by page,
and the runs this rank writes (every page when replicated, its own pages when sharded, the
tokens it computed under a compute-owner direct write)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cpkv_core.planning.execution import ExecutionPlan, KvWriteStrategy
from cpkv_core.planning.ownership import local_page, owner_of_page
from cpkv_core.planning.scheduler import ScheduledBatch
from cpkv_core.planning.segments import SplitSegments

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class CurrentPages:
    """Every page a batch's current tokens touch, as runs of batch tokens."""

    page: IntArray
    g0: IntArray
    count: IntArray
    offset: IntArray
    """Position in the page of the run's first token."""


def current_pages(
    batch: ScheduledBatch, cu_extend: IntArray, flat: IntArray, table_cu: IntArray
) -> CurrentPages:
    """The runs of ``batch``'s current tokens by page (``cu_extend``: the requests' first
    batch tokens; ``flat``/``table_cu``: the page tables, flattened, and their offsets)."""
    ps = batch.page_size
    prefix = np.asarray(batch.prefix_lens, np.int64)
    seq = prefix + np.asarray(batch.extend_lens, np.int64)
    pages = np.asarray(batch.current_pages, np.int64)
    req = np.repeat(np.arange(len(pages), dtype=np.int64), pages)
    first = np.cumsum(pages) - pages
    j = prefix[req] // ps + np.arange(len(req), dtype=np.int64) - first[req]
    start = np.maximum(j * ps, prefix[req])
    end = np.minimum((j + 1) * ps, seq[req])
    return CurrentPages(
        page=flat[table_cu[req] + j],
        g0=cu_extend[req] + start - prefix[req],
        count=end - start,
        offset=start - j * ps,
    )


def write_runs(
    batch: ScheduledBatch, plan: ExecutionPlan, rank: int, pages: CurrentPages, segs: SplitSegments
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
