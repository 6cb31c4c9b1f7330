"""The oracle: the test vehicle without CP, one request at a time, from its own paged pool.

Every CP layout and phase is compared with this. It shares the model math (``model``) with
the engine and nothing else: no split, no collectives, no plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.planning.allocator import PageAllocator
from cpkv_core.planning.batch import BatchSpec, RequestSpec
from cpkv_core.planning.tokens import TokenLedger
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool
from cpkv_core.runtime.model import (
    ModelWeights,
    attend_request,
    embed,
    finish_layer,
    init_weights,
    lm_head,
    project,
)
from cpkv_core.runtime.outputs import BatchOutput, RequestOutput, stack_topk


class ReferenceModel:
    """Runs trace batches without CP; keeps its KV cache across batches (chunked prefill)."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_pages: int,
        page_size: int,
        index_k_dtype: IndexKDtype = IndexKDtype.FP8_E4M3,
        weights: ModelWeights | None = None,
    ) -> None:
        self.cfg = cfg
        self.index_k_dtype = index_k_dtype
        self.weights = weights if weights is not None else init_weights(cfg)
        self.allocator = PageAllocator(num_pages, page_size)
        self.pool = PagedKVPool(cfg, num_pages, page_size, index_k_dtype)
        self.ledger = TokenLedger()

    def run_batch(self, batch: BatchSpec) -> BatchOutput:
        """Runs every request of ``batch`` on its own, in batch order."""
        return BatchOutput(batch.batch, tuple(self.run_request(r) for r in batch.requests))

    def run_request(
        self, req: RequestSpec, token_ids: Sequence[int] | None = None
    ) -> RequestOutput:
        """Allocates, computes and stores one request's chunk; returns its outputs.

        Args:
            token_ids: the chunk's token ids when they come from elsewhere (a decode server
                receives the first decode token from prefill); by default the ledger's.
        """
        self.allocator.allocate(req)
        if token_ids is None:
            token_ids = self.ledger.extend(req, self.cfg.vocab_size)
        positions = torch.arange(req.prefix_len, req.seq_len)
        current_locs = torch.tensor(self.allocator.locs(req.rid, req.prefix_len, req.seq_len))
        key_locs = torch.tensor(self.allocator.req_to_token(req.rid))
        hidden = embed(self.weights, torch.tensor(token_ids), positions)
        topk_per_layer = []
        for layer_index, layer in enumerate(self.weights.layers):
            proj = project(self.cfg, layer, hidden, self.index_k_dtype)
            rows = KVRows(proj.latent, proj.index_k, proj.index_k_scale)
            self.pool.write(layer_index, current_locs, rows)
            keys = self.pool.read(layer_index, key_locs)
            attn, topk = attend_request(
                self.cfg, proj, positions, keys.latent, keys.index_k, keys.index_k_scale
            )
            topk_per_layer.append(topk)
            hidden = finish_layer(layer, hidden, attn)
        normed, logits = lm_head(self.weights, hidden[-1:])
        return RequestOutput(req.rid, normed[0], logits[0], stack_topk(topk_per_layer))
