"""The oracle: the test vehicle without CP, one request at a time, from its own paged pool.

Every CP layout and phase is compared with this. It shares the model math (``model``) with
the engine and nothing else: no split, no collectives, no plan. It runs the same
``ScheduledBatch`` the ranks run (logical pages index its pool directly) and allocates
nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.planning import ScheduledBatch, ScheduledRequest, token_ids
from cpkv_core.planning.query_blocks import contiguous_query_blocks
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool
from cpkv_core.runtime.model import (
    attend_request,
    embed,
    finish_layer,
    lm_head,
    project,
)
from cpkv_core.runtime.outputs import BatchOutput, RequestOutput, stack_topk
from cpkv_core.runtime.weights import ModelWeights, init_weights


class ReferenceModel:
    """Runs scheduled batches without CP; keeps its KV cache across batches."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_pages: int,
        page_size: int,
        index_k_dtype: IndexKDtype = IndexKDtype.FP8_E4M3,
        weights: ModelWeights | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.cfg = cfg
        self.page_size = page_size
        self.index_k_dtype = index_k_dtype
        self.device = torch.device(device)
        self.weights = weights if weights is not None else init_weights(cfg, self.device)
        self.pool = PagedKVPool(cfg, num_pages, page_size, index_k_dtype, self.device)

    def run_batch(self, batch: ScheduledBatch) -> BatchOutput:
        """Runs every request of ``batch`` on its own, in batch order."""
        return BatchOutput(batch.batch, tuple(self.run_request(r) for r in batch.requests))

    def locs(self, req: ScheduledRequest, start: int, end: int) -> torch.Tensor:
        """Logical locs of positions ``[start, end)`` of ``req``, on the reference's device."""
        positions = torch.arange(start, end, device=self.device)
        table = torch.tensor(req.page_table, device=self.device)
        return table[positions // self.page_size] * self.page_size + positions % self.page_size

    def run_request(
        self, req: ScheduledRequest, chunk_token_ids: Sequence[int] | None = None
    ) -> RequestOutput:
        """Computes and stores one request's chunk; returns its outputs.

        Args:
            chunk_token_ids: the chunk's token ids when they come from elsewhere (a decode
                server receives the first decode token from prefill); by default the
                request's own (``tokens.token_ids``).
        """
        positions = torch.arange(req.prefix_len, req.seq_len, device=self.device)
        if chunk_token_ids is None:
            ids = token_ids(
                torch.tensor(req.rid_key, device=self.device), positions, self.cfg.vocab_size
            )
        else:
            ids = torch.tensor(chunk_token_ids, dtype=torch.int64, device=self.device)
        current_locs = self.locs(req, req.prefix_len, req.seq_len)
        key_locs = self.locs(req, 0, req.seq_len)
        hidden = embed(self.weights, ids, positions)
        blocks = contiguous_query_blocks(req.prefix_len, req.seq_len - req.prefix_len)
        topk_per_layer = []
        for layer_index, layer in enumerate(self.weights.layers):
            proj = project(self.cfg, layer, hidden, self.index_k_dtype)
            rows = KVRows(proj.latent, proj.index_k, proj.index_k_scale)
            self.pool.write(layer_index, current_locs, rows)
            keys = self.pool.read(layer_index, key_locs)
            attn, topk = attend_request(
                self.cfg, proj, positions, keys.latent, keys.index_k, keys.index_k_scale, blocks
            )
            topk_per_layer.append(topk)
            hidden = finish_layer(layer, hidden, attn)
        normed, logits = lm_head(self.weights, hidden[-1:])
        return RequestOutput(req.rid, normed[0], logits[0], stack_topk(topk_per_layer))
