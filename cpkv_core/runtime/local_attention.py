"""This rank's queries attended, request by request: the indexer's top-k and the sparse MLA
attention over each request's key rows."""

from __future__ import annotations

import torch
from torch import Tensor

from cpkv_core.config import ModelConfig
from cpkv_core.planning import HostPlan
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.kv_pool import KVRows
from cpkv_core.runtime.model import Projections, attend_request


def attend_local(
    cfg: ModelConfig, proj: Projections, host: HostPlan, tensors: BatchTensors, keys: KVRows
) -> tuple[Tensor, Tensor]:
    """Top-k and sparse attention for this rank's queries, request by request.

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
    attn, topk = [], []
    for req in host.attended:
        req_keys = keys.select(tensors.key_rows[req.key_start : req.key_end])
        attn_r, topk_r = attend_request(
            cfg,
            proj.between(req.row_start, req.row_end),
            tensors.local_positions[req.row_start : req.row_end],
            req_keys.latent,
            req_keys.index_k,
            req_keys.index_k_scale,
        )
        attn.append(attn_r)
        topk.append(topk_r)
    return torch.cat(attn), torch.cat(topk)
