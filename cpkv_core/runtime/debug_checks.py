"""Runtime invariant checks for sharded KV (``SGLANG_DEBUG_CP_SHARED_KV``).

They read tensor values and call collectives, so they synchronise: off by default and
never on in a benchmark. Each raises RuntimeError naming the broken invariant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import KvLayout
from cpkv_core.runtime.kv_pool import KVRows
from cpkv_core.runtime.layout import BatchLayout, KeySource, int_tensor

if TYPE_CHECKING:
    from cpkv_core.runtime.engine import CPEngine


def _same_rows(a: KVRows, b: KVRows) -> bool:
    return (
        torch.equal(a.latent, b.latent)
        and torch.equal(a.index_k.view(torch.uint8), b.index_k.view(torch.uint8))
        and torch.equal(a.index_k_scale, b.index_k_scale)
    )


def check_batch_layer(
    engine: CPEngine, batch: BatchSpec, layout: BatchLayout, current: KVRows, keys: KVRows
) -> None:
    """Writes touch only owned pages; a materialized view holds the current chunk exactly."""
    rank, cp_size, page_size = engine.comm.rank, engine.deploy.cp_size, engine.deploy.page_size
    if engine.kv_layout is KvLayout.SHARDED:
        written = layout.write.written_locs
        owners = (written // page_size) % cp_size
        if not bool((owners == rank).all()):
            raise RuntimeError(
                f"rank {rank} wrote a page it does not own: owners {owners.tolist()}"
            )
    view = layout.read.view
    if layout.read.source is KeySource.VIEW and view is not None:
        rows = [
            row
            for req, key_rows in zip(batch.requests, view.key_rows, strict=True)
            for row in key_rows[req.prefix_len : req.seq_len]
        ]
        if not _same_rows(keys.select(int_tensor(rows)), current):
            raise RuntimeError(
                f"rank {rank}: the materialized view differs from the gathered current chunk"
            )


def check_ownership_partition(engine: CPEngine) -> None:
    """Every page in use was stored by its owner only (sharded) or by every rank (replicated)."""
    written = engine.comm.gather_objects(sorted(engine.written_pages))
    if written is None:
        return
    in_use = engine.allocator.pages_in_use
    sets = [set(pages) for pages in written if isinstance(pages, list)]
    if engine.kv_layout is KvLayout.REPLICATED:
        bad = [rank for rank, pages in enumerate(sets) if pages != in_use]
        if bad:
            raise RuntimeError(f"replicated pools of ranks {bad} miss pages in use")
        return
    cp_size = engine.deploy.cp_size
    for rank, pages in enumerate(sets):
        foreign = sorted(p for p in pages if p % cp_size != rank)
        if foreign:
            raise RuntimeError(f"rank {rank} stored pages it does not own: {foreign[:8]}")
    union = set().union(*sets)
    if union != in_use:
        raise RuntimeError(
            f"shards do not cover the pages in use: missing {sorted(in_use - union)[:8]}"
        )
