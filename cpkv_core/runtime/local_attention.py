"""This rank's queries attended: the indexer's top-k request by request, over each request's
key rows, then the sparse MLA attention of every query at once (``model.attend_rows``)."""

from __future__ import annotations

import torch
from torch import Tensor

from cpkv_core.config import ModelConfig
from cpkv_core.planning import HostPlan
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.kv_pool import KVRows
from cpkv_core.runtime.model import Projections, attend_rows, indexer_topk
from cpkv_core.runtime.topk import NO_KEY


def attend_local(
    cfg: ModelConfig, proj: Projections, host: HostPlan, tensors: BatchTensors, keys: KVRows
) -> tuple[Tensor, Tensor]:
    """Top-k and sparse attention for this rank's queries: the top-k request by request, the
    attention in one call over every request's selected rows (each query's bits are those
    ``attend_request`` gives it, a call per request; ``tests/test_ops.py``).

    A request's local rows are contiguous (a rank's tokens ascend in batch order), so the
    per-request outputs concatenate into local order.

    Returns:
        ``(attn [n_local, num_heads * kv_lora_rank], topk [n_local, index_topk])``.
    """
    if not host.attended:
        q = proj.q
        return q.new_zeros(0, cfg.num_heads * cfg.kv_lora_rank), torch.full(
            (0, cfg.index_topk), -1, dtype=torch.int64, device=q.device
        )
    topk, rows = [], []
    for req in host.attended:
        req_rows = tensors.key_rows[req.key_start : req.key_end]
        topk_r = indexer_topk(
            cfg,
            proj.between(req.row_start, req.row_end),
            tensors.local_positions[req.row_start : req.row_end],
            keys.index_k.index_select(0, req_rows),
            keys.index_k_scale.index_select(0, req_rows),
            req.blocks,
        )
        topk.append(topk_r)
        rows.append(req_rows[topk_r.clamp(min=0)])  # NOTE: as ``sparse_attention`` clamps
    positions = torch.cat(topk)
    q = torch.cat([proj.q[req.row_start : req.row_end] for req in host.attended])
    return attend_rows(cfg, q, keys.latent, torch.cat(rows), positions != NO_KEY), positions
