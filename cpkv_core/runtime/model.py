"""A small NSA/MLA model with deterministic weights: the test vehicle every layout is run on.

Per layer: RMSNorm, MLA latent KV projection (``kv_lora_rank + qk_rope_head_dim`` per token),
an absorbed-MLA query in the latent space, an NSA/DSA indexer (fp8 index q per head, index K
per token, per-head weights) that picks the causal top-k keys of the request, sparse MLA
attention over those keys, output projection and residual. A last-token head ends the model.

A learned-style absolute position table stands in for RoPE: it makes every token's KV depend
on its logical position without transcendental functions (whose SIMD and scalar paths
disagree in the last bit). The rope part of the latent is still projected and stored, so the
KV layout is the real models'.

Every function is batch invariant (see ``ops``): the math for one (query, key) pair does not
depend on which other queries or keys share the call, or on where keys sit in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.planning.query_blocks import QueryBlock
from cpkv_core.runtime.ops import (
    exact_fp8_dot,
    linear,
    ordered_dot,
    quantize_fp8,
    rms_norm,
    softmax_fp64,
    sum_of_products,
)
from cpkv_core.runtime.topk import NO_KEY, select_topk
from cpkv_core.runtime.weights import LayerWeights, ModelWeights


def embed(weights: ModelWeights, token_ids: Tensor, positions: Tensor) -> Tensor:
    """Input hidden states ``[n, hidden]`` for ``token_ids [n]`` at logical ``positions [n]``."""
    return weights.token_embedding.index_select(0, token_ids) + (
        weights.position_embedding.index_select(0, positions)
    )


@dataclass(frozen=True, slots=True)
class Projections:
    """What a layer computes for a set of tokens before attention.

    ``latent``, ``index_k`` and ``index_k_scale`` are what the KV pool stores.
    """

    latent: Tensor  # [n, kv_dim] fp32 MLA latent KV (compressed kv + rope part)
    q: Tensor  # [n, num_heads, kv_dim] fp32 absorbed query
    index_q: Tensor  # [n, index_n_heads, index_head_dim] fp8 or fp32
    index_q_scale: Tensor  # [n, index_n_heads] fp32
    index_weights: Tensor  # [n, index_n_heads] fp32
    index_k: Tensor  # [n, index_head_dim] fp8 or fp32, as stored
    index_k_scale: Tensor  # [n] fp32, as stored

    def between(self, start: int, end: int) -> Projections:
        """The projections of rows ``[start, end)``, as views."""
        return Projections(
            latent=self.latent[start:end],
            q=self.q[start:end],
            index_q=self.index_q[start:end],
            index_q_scale=self.index_q_scale[start:end],
            index_weights=self.index_weights[start:end],
            index_k=self.index_k[start:end],
            index_k_scale=self.index_k_scale[start:end],
        )


def project(
    cfg: ModelConfig, layer: LayerWeights, hidden: Tensor, dtype: IndexKDtype
) -> Projections:
    """Projects ``hidden [n, hidden]`` to latent KV, query and indexer inputs."""
    n = hidden.shape[0]
    x = rms_norm(hidden, layer.attn_norm)
    index_q, index_k, latent, q, index_weights = layer.projected(linear(x, layer.w_project))
    index_q = index_q.view(n, cfg.index_n_heads, cfg.index_head_dim)
    if dtype is IndexKDtype.FP8_E4M3:
        index_q, index_q_scale = quantize_fp8(index_q)
        index_k, index_k_scale = quantize_fp8(index_k)
    else:
        index_q_scale = torch.ones(n, cfg.index_n_heads, device=hidden.device)
        index_k_scale = torch.ones(n, device=hidden.device)
    return Projections(
        latent=latent,
        q=q.view(n, cfg.num_heads, cfg.kv_dim),
        index_q=index_q,
        index_q_scale=index_q_scale,
        index_weights=index_weights * cfg.index_n_heads**-0.5,
        index_k=index_k,
        index_k_scale=index_k_scale,
    )


def index_scores(proj: Projections, keys: Tensor, keys_scale: Tensor) -> Tensor:
    """Indexer logits of queries against one request's keys.

    ``score[i, j] = k_scale[j] * sum_h w[i, h] * q_scale[i, h] * relu(q[i, h] . k[j])``,
    with heads summed in order.

    Args:
        proj: projections of ``nq`` queries of one request.
        keys: ``[num_keys, index_head_dim]`` stored index K (fp8 or fp32).
        keys_scale: ``[num_keys]`` fp32.

    Returns:
        ``[nq, num_keys]`` fp64.
    """
    by_head = proj.index_q.transpose(0, 1)  # [heads, nq, dim]
    if keys.dtype == torch.float8_e4m3fn:
        dots = exact_fp8_dot(by_head, keys)  # [heads, nq, num_keys]
    else:
        dots = ordered_dot(by_head[:, :, None, :], keys[None, None, :, :])
    head_weight = (proj.index_weights.double() * proj.index_q_scale.double()).t()[:, :, None]
    # NOTE: the heads' terms summed first to last as ``ordered_sum`` sums them, one head's
    # [nq, num_keys] slice at a time, in place: no [nq, heads, num_keys] product and no
    # copy of it with heads first (3.5x at 600 queries x 1,700 keys x 4 heads).
    weighted = dots.relu_()
    scores = weighted[0].mul_(head_weight[0])
    for head in range(1, weighted.shape[0]):
        scores.add_(weighted[head].mul_(head_weight[head]))
    return scores.mul_(keys_scale.double()[None, :])


def attention_scale(cfg: ModelConfig) -> float:
    """Softmax scale of the absorbed MLA logits: ``kv_dim ** -0.5``."""
    return float(cfg.kv_dim**-0.5)


def sparse_attention(
    cfg: ModelConfig, q: Tensor, latent_keys: Tensor, topk_positions: Tensor
) -> Tensor:
    """Absorbed MLA attention of each query over its selected keys, in logical order.

    Args:
        q: ``[nq, num_heads, kv_dim]``.
        latent_keys: ``[num_keys, kv_dim]`` the request's latent KV by logical position.
        topk_positions: ``[nq, topk]`` from ``select_topk``.

    Returns:
        ``[nq, num_heads * kv_lora_rank]`` attention output in the latent space.
    """
    valid = topk_positions != NO_KEY
    return attend_rows(cfg, q, latent_keys, topk_positions.clamp(min=0), valid)


def attend_rows(cfg: ModelConfig, q: Tensor, latent: Tensor, rows: Tensor, valid: Tensor) -> Tensor:
    """Absorbed MLA attention of each query over the latent rows it selected.

    Every query's result depends on its own row of ``q``, ``rows`` and ``valid`` alone, so
    the queries of several requests, each selecting from its own keys, can share one call
    (``local_attention.attend_local``) and get the bits each gets alone.

    Args:
        q: ``[nq, num_heads, kv_dim]``.
        latent: ``[num_rows, kv_dim]`` the latent KV the rows index.
        rows: ``[nq, topk]`` each query's selected rows of ``latent``, in logical order; an
            invalid slot's row is read and masked.
        valid: ``[nq, topk]`` which slots hold a selected key.

    Returns:
        ``[nq, num_heads * kv_lora_rank]`` attention output in the latent space.
    """
    # NOTE: both sums run terms-first (``sum_of_products``), each operand gathered straight
    # into that layout: the bits of ``ordered_dot(q, selected)`` and of
    # ``ordered_sum(probs * values, dim=2)`` over ``selected = latent[rows]``, with one
    # gather where those copy the selected rows three times (to fp64, transposed, and each
    # weighted value at once): 1.7x at 600 queries x 16 keys of 576 (tests/test_ops.py).
    # The keys stay fp32: each product widens its fp32 operand exactly, as ``double()``
    # would, without a copy of every selected row in fp64 (1.5x at PD's 576-wide rows).
    q_terms = q.double().movedim(-1, 0).contiguous()[..., None]  # [kv_dim, nq, heads, 1]
    key_terms = _rows_terms_first(latent, rows)[:, :, None, :]  # [kv_dim, nq, 1, topk]
    logits = sum_of_products(q_terms, key_terms) * attention_scale(cfg)
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    probs = softmax_fp64(logits, dim=-1).float()  # [nq, heads, topk]
    value_rows = latent[:, : cfg.kv_lora_rank].index_select(0, rows.t().flatten())
    values = value_rows.view(*rows.t().shape, 1, cfg.kv_lora_rank)  # [topk, nq, 1, kv_lora_rank]
    out = sum_of_products(probs.movedim(-1, 0)[..., None], values)  # [nq, heads, kv_lora_rank]
    return out.reshape(q.shape[0], cfg.num_heads * cfg.kv_lora_rank)


def _rows_terms_first(latent: Tensor, rows: Tensor) -> Tensor:
    """``latent[rows]`` with its last dimension first: ``[kv_dim, *rows.shape]``, contiguous.

    Transposes whichever is smaller, the selected rows or the latent they come from (the
    keys of a pool read are the whole pool).

    NOTE: ``index_select`` of the flat rows, not ``[:, rows]``: the advanced index of a
    non-leading dimension took 1.7x as long (1,100 queries x 16 rows of 576)."""
    flat = rows.flatten()
    if rows.numel() < latent.shape[0]:
        selected = latent.index_select(0, flat).t().contiguous()
    else:
        selected = latent.t().contiguous().index_select(1, flat)
    return selected.view(latent.shape[1], *rows.shape)


def indexer_topk(
    cfg: ModelConfig,
    proj: Projections,
    query_positions: Tensor,
    index_keys: Tensor,
    index_keys_scale: Tensor,
    blocks: Sequence[QueryBlock] = (),
) -> Tensor:
    """The indexer's top-k for queries of one request: ``[nq, index_topk]`` key positions
    (``select_topk``) of ``index_keys [num_keys, index_head_dim]``, row = logical position.

    ``blocks`` (``planning.query_blocks``) cut the queries into calls, each over the keys
    its block sees: the same bits as one call over every key (none: one call)."""
    if not blocks:
        scores = index_scores(proj, index_keys, index_keys_scale)
        return select_topk(scores, query_positions, cfg.index_topk)
    return torch.cat(
        [
            indexer_topk(
                cfg,
                proj.between(block.start, block.end),
                query_positions[block.start : block.end],
                index_keys[: block.num_keys],
                index_keys_scale[: block.num_keys],
            )
            for block in blocks
        ]
    )


def attend_request(
    cfg: ModelConfig,
    proj: Projections,
    query_positions: Tensor,
    latent_keys: Tensor,
    index_keys: Tensor,
    index_keys_scale: Tensor,
    blocks: Sequence[QueryBlock] = (),
) -> tuple[Tensor, Tensor]:
    """Indexer top-k and sparse attention for queries of one request.

    Args:
        proj: projections of ``nq`` queries of the request.
        query_positions: ``[nq]`` their logical positions.
        latent_keys: ``[num_keys, kv_dim]`` the request's latent KV, row = logical position.
        index_keys: ``[num_keys, index_head_dim]`` its stored index K.
        index_keys_scale: ``[num_keys]``.
        blocks: the queries' indexer blocks (``indexer_topk``).

    Returns:
        ``(attn [nq, num_heads * kv_lora_rank], topk_positions [nq, index_topk])``.
    """
    topk_positions = indexer_topk(cfg, proj, query_positions, index_keys, index_keys_scale, blocks)
    return sparse_attention(cfg, proj.q, latent_keys, topk_positions), topk_positions


def finish_layer(layer: LayerWeights, hidden: Tensor, attn: Tensor) -> Tensor:
    """Output projection and residual: ``hidden + attn @ w_o``."""
    return hidden + linear(attn, layer.w_o)


def lm_head(weights: ModelWeights, last_hidden: Tensor) -> tuple[Tensor, Tensor]:
    """Final norm and head for last-token hidden states ``[bs, hidden]``.

    Returns:
        ``(normed hidden [bs, hidden], logits [bs, vocab])``.
    """
    normed = rms_norm(last_hidden, weights.final_norm)
    return normed, linear(normed, weights.w_head)
