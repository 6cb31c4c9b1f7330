"""Runtime invariant checks for sharded KV (``SGLANG_DEBUG_CP_SHARED_KV``).

They read tensor values and call collectives, so they synchronise: off by default and
never on in a benchmark. Each raises RuntimeError naming the broken invariant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from cpkv_core.planning import (
    HostPlan,
    KeySource,
    KvLayout,
    ScheduledBatch,
    owner_of_loc,
    owner_of_page,
)
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.kv_pool import KVRows

if TYPE_CHECKING:
    from cpkv_core.runtime.engine import CPEngine


def _same_rows(a: KVRows, b: KVRows) -> bool:
    return (
        torch.equal(a.latent, b.latent)
        and torch.equal(a.index_k.view(torch.uint8), b.index_k.view(torch.uint8))
        and torch.equal(a.index_k_scale, b.index_k_scale)
    )


class DebugChecks:
    """The checks of one engine, with the host-side record they need."""

    def __init__(self, engine: CPEngine) -> None:
        self.engine = engine
        self.written_pages: set[int] = set()
        """Logical pages this rank has stored KV for."""
        self.pages_in_use: set[int] = set()
        """Logical pages of every page table this rank has run."""

    def check_layer(
        self,
        batch: ScheduledBatch,
        host: HostPlan,
        tensors: BatchTensors,
        current: KVRows,
        keys: KVRows,
    ) -> None:
        """Writes touch only owned pages; a materialized view holds the current chunk exactly."""
        engine = self.engine
        rank, cp_size, page_size = engine.comm.rank, engine.deploy.cp_size, engine.deploy.page_size
        if engine.kv_layout is KvLayout.SHARDED:
            owners = owner_of_loc(tensors.written_locs.cpu().numpy(), page_size, cp_size)
            if not bool((owners == rank).all()):
                raise RuntimeError(
                    f"rank {rank} wrote a page it does not own: owners {owners.tolist()}"
                )
        view = host.view
        if host.key_source is not KeySource.VIEW or view is None:
            return
        starts = np.cumsum([0, *(len(r.page_table) for r in batch.requests)])
        rows = np.concatenate(
            [
                view.key_rows(slice(starts[i], starts[i + 1]), req.seq_len)[req.prefix_len :]
                for i, req in enumerate(batch.requests)
            ]
        )
        index = torch.from_numpy(rows).to(keys.latent.device)
        if not _same_rows(keys.select(index), current):
            raise RuntimeError(
                f"rank {rank}: the materialized view differs from the gathered current chunk"
            )

    def after_batch(self, batch: ScheduledBatch, tensors: BatchTensors) -> None:
        """Records the batch's pages, then checks that the shards partition them."""
        page_size = self.engine.deploy.page_size
        self.written_pages.update((tensors.written_locs // page_size).tolist())
        for req in batch.requests:
            self.pages_in_use.update(req.page_table.tolist())
        self.check_ownership_partition()

    def check_ownership_partition(self) -> None:
        """Every page in use was stored by its owner only (sharded) or by every rank
        (replicated)."""
        engine = self.engine
        written = engine.comm.gather_objects(sorted(self.written_pages))
        if written is None:
            return
        in_use = self.pages_in_use
        sets = [set(pages) for pages in written if isinstance(pages, list)]
        if engine.kv_layout is KvLayout.REPLICATED:
            bad = [rank for rank, pages in enumerate(sets) if pages != in_use]
            if bad:
                raise RuntimeError(f"replicated pools of ranks {bad} miss pages in use")
            return
        cp_size = engine.deploy.cp_size
        for rank, pages in enumerate(sets):
            foreign = sorted(p for p in pages if owner_of_page(p, cp_size) != rank)
            if foreign:
                raise RuntimeError(f"rank {rank} stored pages it does not own: {foreign[:8]}")
        union = set().union(*sets)
        if union != in_use:
            raise RuntimeError(
                f"shards do not cover the pages in use: missing {sorted(in_use - union)[:8]}"
            )
