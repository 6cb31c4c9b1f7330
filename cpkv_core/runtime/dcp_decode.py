"""One decode step over KV sharded across decode CP ranks (DCP): each rank attends over its
own pages and the ranks merge what they found.

Every rank holds the same query (the hidden state is replicated: every rank embeds the same
token and applies the same weights), and only its own keys. Per layer:

1. The owner of the new token's page stores its KV; the others store nothing.
2. Each rank scores its keys with the indexer and keeps its best ``index_topk`` candidates
   (score descending, ties by lower logical position, as ``model.select_topk`` orders
   them). The candidates of every rank are all-gathered and the global top-k is the best
   ``index_topk`` of their union under the same order: exactly the reference's set, since
   the scores are batch invariant (``ops``) and every global winner is a local winner.
3. Each rank runs the absorbed MLA attention over the selected keys it holds, as a partial:
   its largest logit, its sum of ``exp(logit - max)`` and its unnormalised output, in fp64.
   The partials are all-gathered and merged with log-sum-exp: the reference's softmax over
   the union, up to rounding (the reference rounds its probabilities to fp32 before the
   weighted sum; within ``OUTPUT_ATOL``).

Two all-gathers a layer, of ``2 x index_topk`` and ``heads x (2 + kv_lora_rank)`` values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.dist import Communicator
from cpkv_core.runtime.kv_pool import KVRows, PagedKVPool
from cpkv_core.runtime.model import (
    attention_scale,
    embed,
    finish_layer,
    index_scores,
    lm_head,
    project,
)
from cpkv_core.runtime.ops import ordered_dot, ordered_sum
from cpkv_core.runtime.outputs import RequestOutput, stack_topk
from cpkv_core.runtime.topk import NO_KEY
from cpkv_core.runtime.weights import ModelWeights

NO_CANDIDATE = torch.iinfo(torch.int64).max
"""Position of a padding candidate (a rank with fewer keys than ``index_topk``): sorts after
every real key and is dropped to ``NO_KEY``."""

TOPK_TAG = "dcp_topk"
"""Bytes of the candidate all-gather are counted under this tag."""
ATTENTION_TAG = "dcp_attention"
"""Bytes of the attention-partial all-gather are counted under this tag."""


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """One decode rank's keys of one request, the new token's included when it owns it."""

    locs: Tensor
    """``[n]`` int64 rows of the rank's pool, in position order."""
    positions: Tensor
    """``[n]`` int64 logical token positions of those rows, ascending."""


def local_candidates(scores: Tensor, positions: Tensor, topk: int) -> tuple[Tensor, Tensor]:
    """A rank's best ``topk`` keys, best first, padded to ``topk``.

    Args:
        scores: ``[n]`` fp64 indexer scores of the rank's keys, in position order.
        positions: ``[n]`` their ascending logical positions.

    Returns:
        ``(scores [topk] fp64, positions [topk] int64)``; padding is ``-inf`` at
        ``NO_CANDIDATE``.
    """
    # NOTE: a stable descending sort over ascending positions breaks ties by position.
    order = torch.sort(scores, descending=True, stable=True).indices[:topk]
    pad = topk - int(order.shape[0])
    best_scores = torch.cat([scores[order], scores.new_full((pad,), float("-inf"))])
    best_positions = torch.cat([positions[order], positions.new_full((pad,), NO_CANDIDATE)])
    return best_scores, best_positions


def merge_candidates(scores: Tensor, positions: Tensor, topk: int) -> Tensor:
    """The global top-k from every rank's candidates: ``[topk]`` logical positions
    ascending, ``NO_KEY`` padding at the end (``model.select_topk``'s form).

    Args:
        scores: ``[ranks, topk]`` fp64 candidates' scores (``local_candidates``).
        positions: ``[ranks, topk]`` their positions.
    """
    flat_scores, flat_positions = scores.reshape(-1), positions.reshape(-1)
    by_position = torch.sort(flat_positions, stable=True).indices
    flat_scores, flat_positions = flat_scores[by_position], flat_positions[by_position]
    best = torch.sort(flat_scores, descending=True, stable=True).indices[:topk]
    chosen = torch.sort(flat_positions[best]).values
    return torch.where(chosen == NO_CANDIDATE, NO_KEY, chosen)


def attention_partial(cfg: ModelConfig, q: Tensor, latent: Tensor) -> Tensor:
    """One rank's share of the absorbed MLA attention of one query over its selected keys.

    Args:
        q: ``[num_heads, kv_dim]`` the query.
        latent: ``[k, kv_dim]`` the selected keys this rank holds (``k`` may be 0).

    Returns:
        ``[num_heads, 2 + kv_lora_rank]`` fp64: per head the largest logit (``-inf`` for no
        keys), the sum of ``exp(logit - largest)`` and the unnormalised output.
    """
    heads, rank = q.shape[0], cfg.kv_lora_rank
    if latent.shape[0] == 0:
        empty = torch.zeros(heads, 2 + rank, dtype=torch.float64, device=q.device)
        empty[:, 0] = float("-inf")
        return empty
    logits = ordered_dot(q[:, None, :], latent[None, :, :]) * attention_scale(cfg)
    largest = logits.amax(dim=-1)
    weights = torch.exp(logits - largest[:, None])  # [heads, k]
    values = latent[:, :rank].double()
    out = ordered_sum(weights[:, :, None] * values[None, :, :], dim=1)  # [heads, rank]
    return torch.cat([largest[:, None], ordered_sum(weights, dim=1)[:, None], out], dim=1)


def merge_partials(parts: Tensor) -> Tensor:
    """Every rank's partial merged with log-sum-exp.

    Args:
        parts: ``[ranks, num_heads, 2 + kv_lora_rank]`` (``attention_partial``).

    Returns:
        ``[num_heads * kv_lora_rank]`` fp32 attention output in the latent space.
    """
    largest, sums, outs = parts[:, :, 0], parts[:, :, 1], parts[:, :, 2:]
    overall = largest.amax(dim=0)  # [heads]; finite: some rank holds a selected key
    scale = torch.exp(largest - overall[None, :])  # 0 for a rank without selected keys
    total = ordered_sum(scale * sums, dim=0)
    merged = ordered_sum(scale[:, :, None] * outs, dim=0) / total[:, None]
    return merged.float().reshape(-1)


def dcp_decode_step(
    cfg: ModelConfig,
    weights: ModelWeights,
    pool: PagedKVPool,
    comm: Communicator,
    token: tuple[str, int, int],
    keys: ShardKeys,
    new_loc: int | None,
    index_k_dtype: IndexKDtype,
) -> RequestOutput:
    """One decode token of one request on every rank of ``comm`` (call it on every rank).

    Args:
        token: ``(rid, token id, logical position)`` of the decode token.
        keys: this rank's keys of the request, the new token's row included if it owns it.
        new_loc: the pool row this rank stores the new token's KV at, None if another rank
            owns its page.

    Returns:
        The reference's ``run_request`` outputs of the token: final-normed hidden state,
        logits and ``[num_layers, 1, index_topk]`` top-k positions; the same on every rank.
    """
    rid, token_id, position = token
    device = keys.locs.device
    hidden = embed(
        weights,
        torch.tensor([token_id], device=device),
        torch.tensor([position], device=device),
    )
    topk_per_layer = []
    for layer_index, layer in enumerate(weights.layers):
        proj = project(cfg, layer, hidden, index_k_dtype)
        if new_loc is not None:
            rows = KVRows(proj.latent, proj.index_k, proj.index_k_scale)
            pool.write(layer_index, torch.tensor([new_loc], device=device), rows)
        kv = pool.read(layer_index, keys.locs)
        scores = index_scores(proj, kv.index_k, kv.index_k_scale)[0]
        best, where = local_candidates(scores, keys.positions, cfg.index_topk)
        candidates = comm.all_gather(torch.stack([best.view(torch.int64), where]), TOPK_TAG)
        chosen = merge_candidates(
            candidates[:, 0].view(torch.float64), candidates[:, 1], cfg.index_topk
        )
        # NOTE: a data-dependent selection (the rows this rank holds of the chosen keys):
        # the decode step runs eagerly on the host, not in a CUDA graph.
        mine = torch.isin(keys.positions, chosen)
        partial = attention_partial(cfg, proj.q[0], kv.latent[mine])
        attn = merge_partials(comm.all_gather(partial, ATTENTION_TAG))
        topk_per_layer.append(chosen[None, :])
        hidden = finish_layer(layer, hidden, attn[None, :])
    normed, logits = lm_head(weights, hidden[-1:])
    return RequestOutput(rid, normed[0], logits[0], stack_topk(topk_per_layer))
