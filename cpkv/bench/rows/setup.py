"""The real-rows bench's inputs: its grid, the storage of one token's row, and one grid
point scheduled by the engine's own scheduler and gate, with the host plans and pools its
ops read.

A point is a batch of ``bs`` requests that each continue after ``history`` cached tokens
with ``chunk / bs`` new ones (SGLang's chunked prefill: ``chunk`` tokens a batch), on
``cp_size`` ranks at page 64. ``shared_prefix`` makes the requests new ones that share one
``history``-token prefix (a radix-cache hit), where slot and unique remap differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cpkv.bench.measure import ALL_PHASES
from cpkv.bench.rows.group import random_bytes_
from cpkv.plan.kv_bytes import KvCacheDtype, kv_bytes_per_token_per_layer, latent_bytes_per_token
from cpkv.run.loop import HostLoop
from cpkv_core.config import CpMode, DeploymentConfig, IndexKDtype, ModelConfig
from cpkv_core.planning import (
    BatchSpec,
    ExecutionPlan,
    HostPlan,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    RequestSpec,
    ScheduledBatch,
    build_host_plan,
    local_page,
    owner_of_page,
    pages_for_trace,
)
from cpkv_core.runtime import BatchTensors, KVRows, PagedKVPool, expand, upload
from cpkv_core.runtime.kv_pool import LatentStorage

__all__ = ["GRIDS", "PointSetup", "RowFormat", "RowsGrid", "RowsPoint", "row_format"]

HIDDEN_DTYPE = torch.bfloat16
"""Storage of the hidden states the tail gathers (the serving engine's activations)."""
RANK = 0
"""The rank whose ops are timed."""
INDEX_K_BYTES = torch.float8_e4m3fn.itemsize
SCALE_BYTES = torch.float32.itemsize


@dataclass(frozen=True, slots=True)
class RowsGrid:
    """The points a real-rows run measures."""

    name: str
    histories: tuple[int, ...]
    """History tokens per request."""
    chunk: int
    """Current tokens of the batch, split evenly over its requests."""
    batch_sizes: tuple[int, ...]
    cp_sizes: tuple[int, ...]
    page_size: int = 64

    def points(self) -> list[RowsPoint]:
        """Every point, and a shared-prefix twin of every point with more than one request."""
        points = []
        for history in self.histories:
            for bs in self.batch_sizes:
                for cp_size in self.cp_sizes:
                    points.append(RowsPoint(history, bs, cp_size, False))
                    if bs > 1:
                        points.append(RowsPoint(history, bs, cp_size, True))
        return points


GRIDS = {
    "full": RowsGrid("full", (8192, 32768, 131072), 8192, (1, 4), (2, 4, 8)),
    "small": RowsGrid("small", (1024, 4096), 2048, (1, 4), (2, 4)),
    "tiny": RowsGrid("tiny", (128,), 256, (1, 2), (2,), page_size=16),
}
"""``--rows-grid``: ``full`` is the production grid (minutes); ``small`` runs in under a
minute; ``tiny`` (page 16) in seconds, for smoke tests."""


@dataclass(frozen=True, slots=True)
class RowsPoint:
    """One point of the grid."""

    history: int
    bs: int
    cp_size: int
    shared_prefix: bool


@dataclass(frozen=True, slots=True)
class RowFormat:
    """One token's row in one layer, as stored, and the tail's hidden state."""

    latent: LatentStorage
    index_head_dim: int
    """Index K is stored in fp8 with one fp32 scale a token."""
    hidden_size: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one token in one layer: latent, index K and its scale."""
        return self.latent.row_bytes + self.index_head_dim * INDEX_K_BYTES + SCALE_BYTES

    @property
    def hidden_bytes(self) -> int:
        """Bytes of one token's hidden state."""
        return self.hidden_size * HIDDEN_DTYPE.itemsize


def row_format(model: ModelConfig, kv_dtype: KvCacheDtype) -> RowFormat:
    """The storage ``cpkv plan`` counts: a bf16 latent, or FlashMLA's fp8 layout as opaque
    bytes; fp8 index K with an fp32 scale.

    Raises:
        RuntimeError: the pool's row would differ from ``kv_bytes_per_token_per_layer``.
    """
    if kv_dtype is KvCacheDtype.FP8_E4M3:
        latent = LatentStorage(torch.uint8, latent_bytes_per_token(model, kv_dtype))
    else:
        latent = LatentStorage(torch.bfloat16, model.kv_dim)
    fmt = RowFormat(latent, model.index_head_dim, model.hidden_size)
    if fmt.row_bytes != kv_bytes_per_token_per_layer(model, kv_dtype):
        raise RuntimeError(
            f"{model.name} rows of {fmt.row_bytes} B differ from the plan's, indicates a bug"
        )
    return fmt


def _batches(point: RowsPoint, chunk: int) -> tuple[BatchSpec, BatchSpec]:
    extend = chunk // point.bs
    if point.shared_prefix:
        first = BatchSpec(0, (RequestSpec("src", 0, point.history),))
        reqs = tuple(
            RequestSpec(f"p{i}", point.history, extend, prefix_from="src") for i in range(point.bs)
        )
        return first, BatchSpec(1, reqs)
    first = BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, point.history) for i in range(point.bs)))
    reqs = tuple(RequestSpec(f"r{i}", point.history, extend) for i in range(point.bs))
    return first, BatchSpec(1, reqs)


class PointSetup:
    """One point's scheduled batch, its plans per level on rank 0, and lazily its pools.

    The batch is scheduled by the engine's scheduler with every phase enabled, so its pages
    go to their compute owners and the gate gives it phase 5 (the direct write's plan).
    """

    def __init__(
        self, model: ModelConfig, fmt: RowFormat, point: RowsPoint, grid: RowsGrid, device: str
    ) -> None:
        self.model = model.model_copy(update={"num_layers": 1})
        self.fmt, self.point, self.device = fmt, point, torch.device(device)
        self.deploy = DeploymentConfig(
            cp_size=point.cp_size, page_size=grid.page_size, cp_mode=CpMode.IN_SEQ_SPLIT
        )
        first, second = _batches(point, grid.chunk)
        pages = pages_for_trace([first, second], grid.page_size, point.cp_size)
        loop = HostLoop(self.deploy, ALL_PHASES, pages)
        loop.step(first)
        step = loop.step(second)
        self.batch: ScheduledBatch = step.scheduled
        self.direct_plan = step.decision.plan
        if self.direct_plan.kv_write is not KvWriteStrategy.COMPUTE_OWNER_DIRECT:
            raise ValueError(
                f"{point}: the gate gives the batch phase {step.decision.phase}, not 5: each "
                f"request's {grid.chunk // point.bs} current tokens need 2 x cp_size pages"
            )
        baseline = ExecutionPlan.baseline(CpMode.IN_SEQ_SPLIT)
        self.level0_plan = baseline
        self.level1_plan = ExecutionPlan(
            baseline.split, baseline.kv_write, baseline.kv_read, OutputStrategy.NARROW_LAST_TOKEN
        )
        self.level2_plan = ExecutionPlan(
            baseline.split,
            KvWriteStrategy.OWNER_FILTERED,
            KvReadStrategy.MATERIALIZED_SLOT,
            OutputStrategy.NARROW_LAST_TOKEN,
        )
        used = np.unique(np.concatenate([r.page_table for r in self.batch.requests]))
        self.used_pages = used.astype(np.int64)
        self._shards: dict[int, PagedKVPool] = {}

    @property
    def row_bytes(self) -> int:
        """Bytes of one token in one layer."""
        return self.fmt.row_bytes

    @property
    def view_tokens(self) -> int:
        """History and current tokens the batch reads (the plan's ``max_view_tokens``)."""
        return sum(r.seq_len for r in self.batch.requests)

    def plan(self, strategies: ExecutionPlan, peer_read: bool = False) -> HostPlan:
        """Rank 0's host plan of the batch under ``strategies``."""
        return build_host_plan(self.batch, strategies, RANK, peer_read=peer_read)

    def tensors(self, host: HostPlan) -> BatchTensors:
        """The plan's tables on the device, expanded to per-token indices."""
        return expand(host, upload(host, self.device), self.model.vocab_size)

    def pool(self, owner: int | None) -> PagedKVPool:
        """Owner ``owner``'s shard (None: a replicated pool), one layer, random bytes; only
        as many pages as the batch's page tables reach."""
        cp = self.point.cp_size
        if owner is None:
            num_pages = int(self.used_pages.max()) + 1
        else:
            mine = self.used_pages[owner_of_page(self.used_pages, cp) == owner]
            num_pages = int(local_page(mine, cp).max(initial=0)) + 1
        pool = PagedKVPool(
            self.model,
            num_pages,
            self.deploy.page_size,
            IndexKDtype.FP8_E4M3,
            self.device,
            latent=self.fmt.latent,
        )
        for tensor in (pool.layers[0].latent, pool.layers[0].index_k, pool.layers[0].index_k_scale):
            random_bytes_(tensor, seed=owner or 0)
        return pool

    def shard(self, owner: int) -> PagedKVPool:
        """Owner ``owner``'s shard, made on first use and kept until ``free_shards``."""
        if owner not in self._shards:
            self._shards[owner] = self.pool(owner)
        return self._shards[owner]

    @property
    def shards(self) -> list[PagedKVPool]:
        """Every owner's shard (peer-read reads them all), rank 0's first."""
        return [self.shard(owner) for owner in range(self.point.cp_size)]

    def free_shards(self) -> None:
        """Drops every shard made so far."""
        self._shards.clear()

    def rows(self, n: int, seed: int = 1) -> KVRows:
        """``n`` token rows of random bytes (a rank's computed KV, or a gathered chunk)."""
        latent = self.fmt.latent
        parts = (
            torch.empty(n, latent.width, dtype=latent.dtype, device=self.device),
            torch.empty(
                n, self.model.index_head_dim, dtype=torch.float8_e4m3fn, device=self.device
            ),
            torch.empty(n, dtype=torch.float32, device=self.device),
        )
        return KVRows(*(random_bytes_(t, seed) for t in parts))

    def hidden(self, n: int) -> torch.Tensor:
        """``n`` hidden states of random bytes."""
        out = torch.empty(n, self.fmt.hidden_size, dtype=HIDDEN_DTYPE, device=self.device)
        return random_bytes_(out, seed=2)
