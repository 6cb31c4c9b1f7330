"""The CP prefill engine: one rank's execution of a batch under an ``ExecutionPlan``.

Per batch: host metadata first (allocation, token ids, split, index tensors; ``prepare``),
then tensor work per layer: local projections, all-gather of the current KV and index K,
the KV write, the KV read with top-k and sparse attention for local queries; then the tail
collects hidden states and every rank computes the last-token outputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.dist.comm import Communicator
from cpkv_core.planning.allocation import allocate_batch
from cpkv_core.planning.allocator import PageAllocator
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import ExecutionPlan, KvLayout, OutputStrategy
from cpkv_core.planning.tokens import TokenLedger
from cpkv_core.runtime.debug_checks import check_batch_layer, check_ownership_partition
from cpkv_core.runtime.kv_access import key_source, write_current
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool
from cpkv_core.runtime.layout import BatchLayout, KeySource, build_batch_split, build_layout
from cpkv_core.runtime.model import (
    ModelWeights,
    Projections,
    attend_request,
    embed,
    finish_layer,
    init_weights,
    lm_head,
    project,
)
from cpkv_core.runtime.outputs import RankBatchOutput


class CPEngine:
    """One CP rank: its allocator, its KV pool and the plan executor.

    Every rank runs the same host-side allocator and sees the same logical locs. The pool
    layout (replicated or sharded) is fixed at construction; every plan must agree with it.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        deploy: DeploymentConfig,
        comm: Communicator,
        num_pages: int,
        kv_layout: KvLayout = KvLayout.REPLICATED,
        weights: ModelWeights | None = None,
        debug_checks: bool = False,
    ) -> None:
        """Args:
        num_pages: logical pages of the KV address space (a multiple of cp_size is
            best: each owner gets ``ceil(num_pages / cp_size)`` of them).
        kv_layout: replicated (every page on every rank) or sharded (owned pages only).
        debug_checks: run the invariant checks of ``debug_checks``; they synchronise.
        """
        if comm.world_size != deploy.cp_size:
            raise ValueError(
                f"process group has {comm.world_size} ranks but cp_size is {deploy.cp_size}"
            )
        self.cfg = cfg
        self.deploy = deploy
        self.comm = comm
        self.kv_layout = kv_layout
        self.debug_checks = debug_checks
        self.weights = weights if weights is not None else init_weights(cfg)
        self.allocator = PageAllocator(num_pages, deploy.page_size, num_owners=deploy.cp_size)
        pool_pages = (
            num_pages if kv_layout is KvLayout.REPLICATED else -(-num_pages // deploy.cp_size)
        )
        self.pool = PagedKVPool(cfg, pool_pages, deploy.page_size, deploy.index_k_dtype)
        self.ledger = TokenLedger()
        self.written_pages: set[int] = set()
        """Logical pages this rank has stored KV for (tracked only under debug_checks)."""

    def prepare(self, batch: BatchSpec, plan: ExecutionPlan) -> BatchLayout:
        """Allocates the batch's pages and builds its host-side metadata for this rank."""
        if plan.kv_layout is not self.kv_layout:
            raise RuntimeError(
                f"batch {batch.batch}: plan writes a {plan.kv_layout} layout into a "
                f"{self.kv_layout} pool, indicates a bug in the gate (KV at rest cannot change)"
            )
        split = build_batch_split(plan.split, batch, self.deploy.cp_size, self.deploy.page_size)
        allocate_batch(self.allocator, batch, plan)
        tokens = [self.ledger.extend(req, self.cfg.vocab_size) for req in batch.requests]
        return build_layout(batch, plan, split, self.comm.rank, tokens, self.allocator)

    def run_batch(self, batch: BatchSpec, plan: ExecutionPlan) -> RankBatchOutput:
        """Runs one batch on this rank; every rank of the group must call it together."""
        start = time.perf_counter()
        before = self._gathered_bytes()
        layout = self.prepare(batch, plan)
        hidden = embed(self.weights, layout.local_token_ids, layout.local_positions)
        topk_per_layer = []
        for layer_index, layer in enumerate(self.weights.layers):
            proj = project(self.cfg, layer, hidden, self.deploy.index_k_dtype)
            own = KVRows(proj.latent, proj.index_k, proj.index_k_scale)
            # NOTE: without a gather only the direct write reads rows, and it reads ``own``.
            current = self._gather_current(own, layout) if self._needs_current(layout) else own
            source = own if layout.write.from_local else current
            write_current(self.pool, layer_index, layout.write, source)
            keys = key_source(self.comm, self.pool, layer_index, layout.read, current)
            if self.debug_checks:
                check_batch_layer(self, batch, layout, current, keys)
            attn, topk = attend_local(self.cfg, proj, layout, keys)
            topk_per_layer.append(topk)
            hidden = finish_layer(layer, hidden, attn)
        if self.debug_checks:
            self.written_pages.update(self._pages_of(layout.write.written_locs))
            check_ownership_partition(self)
        last_hidden = COLLECTORS[plan.output](self, hidden, layout)
        normed, logits = lm_head(self.weights, last_hidden)
        after = self._gathered_bytes()
        return RankBatchOutput(
            batch=batch.batch,
            rank=self.comm.rank,
            local_token_indices=layout.local_token_indices,
            topk=torch.stack(topk_per_layer),
            last_hidden=normed,
            logits=logits,
            gathered_bytes={tag: after[tag] - before.get(tag, 0) for tag in after},
            kv_bytes=self.pool.bytes_for_pages(self.stored_pages()),
            seconds=time.perf_counter() - start,
        )

    def stored_pages(self) -> int:
        """Pages in use that this rank's pool stores."""
        if self.kv_layout is KvLayout.REPLICATED:
            return self.allocator.num_pages_in_use
        return self.allocator.pages_in_use_by_owner()[self.comm.rank]

    def _pages_of(self, locs: Tensor) -> set[int]:
        return set((locs // self.deploy.page_size).tolist())

    def _gathered_bytes(self) -> dict[str, int]:
        return {tag: s.bytes_gathered for tag, s in self.comm.stats.by_tag.items()}

    def all_gather_tokens(self, local: Tensor, layout: BatchLayout, tag: str) -> Tensor:
        """All-gathers per-token rows into batch order.

        Args:
            local: ``[n_local, ...]`` this rank's rows, in local order.

        Returns:
            ``[num_tokens, ...]`` every rank's rows, in batch order.
        """
        pad_rows = layout.split.max_local - local.shape[0]
        if pad_rows:
            local = torch.cat([local, local.new_zeros((pad_rows, *local.shape[1:]))])
        stacked = self.comm.all_gather(local, tag)  # [cp_size, max_local, ...]
        return stacked.flatten(0, 1)[layout.gather_index]

    def _needs_current(self, layout: BatchLayout) -> bool:
        """The chunk is all-gathered when the write or the read needs it, or for checks."""
        return (
            not layout.write.from_local
            or layout.read.source is KeySource.CURRENT
            or self.debug_checks
        )

    def _gather_current(self, own: KVRows, layout: BatchLayout) -> KVRows:
        return KVRows(
            latent=self.all_gather_tokens(own.latent, layout, "current_kv"),
            index_k=self.all_gather_tokens(own.index_k, layout, "current_index_k"),
            index_k_scale=self.all_gather_tokens(own.index_k_scale, layout, "current_index_k"),
        )


def attend_local(
    cfg: ModelConfig, proj: Projections, layout: BatchLayout, keys: KVRows
) -> tuple[Tensor, Tensor]:
    """Top-k and sparse attention for this rank's queries, request by request.

    Returns:
        ``(attn [n_local, num_heads * kv_lora_rank], topk [n_local, index_topk])``.
    """
    n_local = proj.q.shape[0]
    attn = proj.q.new_zeros(n_local, cfg.num_heads * cfg.kv_lora_rank)
    topk = torch.full((n_local, cfg.index_topk), -1, dtype=torch.int64, device=proj.q.device)
    for req in layout.requests:
        req_keys = keys.select(req.key_rows)
        attn_r, topk_r = attend_request(
            cfg,
            proj.rows(req.local_rows),
            req.positions,
            req_keys.latent,
            req_keys.index_k,
            req_keys.index_k_scale,
        )
        attn[req.local_rows] = attn_r
        topk[req.local_rows] = topk_r
    return attn, topk


def collect_full_gather(engine: CPEngine, hidden: Tensor, layout: BatchLayout) -> Tensor:
    """Phase 0: all-gather every token's hidden state, then keep each request's last token.

    Returns:
        ``[bs, hidden]`` last-token hidden states, identical on every rank.
    """
    full = engine.all_gather_tokens(hidden, layout, "tail_hidden")  # [num_tokens, hidden]
    return full[layout.last_token_indices]


def collect_narrow_last_token(engine: CPEngine, hidden: Tensor, layout: BatchLayout) -> Tensor:
    """Phase 1: each rank contributes ``[bs, hidden]`` holding the last-token states it
    computed (zeros elsewhere); after the gather each request's row comes from its last
    token's rank.

    Returns:
        ``[bs, hidden]`` last-token hidden states, identical on every rank.
    """
    bs = layout.last_token_ranks.shape[0]
    contribution = hidden.new_zeros(bs, hidden.shape[1])
    contribution[layout.local_last_requests] = hidden[layout.local_last_rows]
    gathered = engine.comm.all_gather(contribution, "tail_hidden")  # [cp_size, bs, hidden]
    return gathered[layout.last_token_ranks, torch.arange(bs)]


COLLECTORS: dict[OutputStrategy, Callable[[CPEngine, Tensor, BatchLayout], Tensor]] = {
    OutputStrategy.FULL_GATHER: collect_full_gather,
    OutputStrategy.NARROW_LAST_TOKEN: collect_narrow_last_token,
}
