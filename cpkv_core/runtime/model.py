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

import functools
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.runtime.ops import (
    exact_fp8_dot,
    linear,
    ordered_dot,
    ordered_sum,
    quantize_fp8,
    rms_norm,
    softmax_fp64,
)
from cpkv_core.runtime.topk import NO_KEY, select_topk

MAX_POSITIONS = 1 << 16
"""Rows of the position table: the longest request the test vehicle takes."""


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One layer's weights; shapes in elements."""

    attn_norm: Tensor  # [hidden]
    w_kv: Tensor  # [hidden, kv_dim]
    w_q: Tensor  # [hidden, num_heads * kv_dim]
    w_index_q: Tensor  # [hidden, index_n_heads * index_head_dim]
    w_index_k: Tensor  # [hidden, index_head_dim]
    w_index_weights: Tensor  # [hidden, index_n_heads]
    w_o: Tensor  # [num_heads * kv_lora_rank, hidden]


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """All weights of the test vehicle, fp32 on one device."""

    token_embedding: Tensor  # [vocab, hidden]
    position_embedding: Tensor  # [MAX_POSITIONS, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor  # [hidden]
    w_head: Tensor  # [hidden, vocab]


def init_weights(cfg: ModelConfig, device: torch.device | str = "cpu") -> ModelWeights:
    """Deterministic weights from ``cfg.seed``: the same on every rank and every run.

    Drawn once a process per config on the host (~50 ms for the tiny model: every engine
    of every rank and level asks for them) and copied to ``device``; on the CPU every
    caller shares the same tensors, which nothing writes to.

    Raises:
        ValueError: ``cfg`` has no indexer: the test vehicle is a sparse-attention model.
    """
    if not cfg.has_indexer:
        raise ValueError(
            f"model {cfg.name!r} has no DSA indexer; the test vehicle runs sparse-attention "
            "MLA models only (a model without an indexer can be planned with cpkv plan)"
        )
    host = _host_weights(cfg)
    if torch.device(device).type == "cpu":
        return host
    return ModelWeights(
        token_embedding=host.token_embedding.to(device),
        position_embedding=host.position_embedding.to(device),
        layers=tuple(
            LayerWeights(**{f.name: getattr(layer, f.name).to(device) for f in fields(layer)})
            for layer in host.layers
        ),
        final_norm=host.final_norm.to(device),
        w_head=host.w_head.to(device),
    )


@functools.lru_cache(maxsize=4)
def _host_weights(cfg: ModelConfig) -> ModelWeights:
    device = "cpu"
    gen = torch.Generator().manual_seed(cfg.seed)

    def normal(rows: int, cols: int, std: float) -> Tensor:
        return (torch.randn(rows, cols, generator=gen) * std).to(device)

    h = cfg.hidden_size
    std_in = h**-0.5
    layers = tuple(
        LayerWeights(
            attn_norm=torch.ones(h, device=device),
            w_kv=normal(h, cfg.kv_dim, std_in),
            w_q=normal(h, cfg.num_heads * cfg.kv_dim, std_in),
            w_index_q=normal(h, cfg.index_n_heads * cfg.index_head_dim, std_in),
            w_index_k=normal(h, cfg.index_head_dim, std_in),
            w_index_weights=normal(h, cfg.index_n_heads, std_in),
            w_o=normal(
                cfg.num_heads * cfg.kv_lora_rank, h, (cfg.num_heads * cfg.kv_lora_rank) ** -0.5
            ),
        )
        for _ in range(cfg.num_layers)
    )
    return ModelWeights(
        token_embedding=normal(cfg.vocab_size, h, 1.0),
        position_embedding=normal(MAX_POSITIONS, h, 0.5),
        layers=layers,
        final_norm=torch.ones(h, device=device),
        w_head=normal(h, cfg.vocab_size, std_in),
    )


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
    index_q = linear(x, layer.w_index_q).view(n, cfg.index_n_heads, cfg.index_head_dim)
    index_k = linear(x, layer.w_index_k)
    if dtype is IndexKDtype.FP8_E4M3:
        index_q, index_q_scale = quantize_fp8(index_q)
        index_k, index_k_scale = quantize_fp8(index_k)
    else:
        index_q_scale = torch.ones(n, cfg.index_n_heads, device=hidden.device)
        index_k_scale = torch.ones(n, device=hidden.device)
    return Projections(
        latent=linear(x, layer.w_kv),
        q=linear(x, layer.w_q).view(n, cfg.num_heads, cfg.kv_dim),
        index_q=index_q,
        index_q_scale=index_q_scale,
        index_weights=linear(x, layer.w_index_weights) * cfg.index_n_heads**-0.5,
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
    if keys.dtype == torch.float8_e4m3fn:
        dots = exact_fp8_dot(proj.index_q, keys)  # [nq, heads, num_keys]
    else:
        dots = ordered_dot(proj.index_q[:, :, None, :], keys[None, None, :, :])
    head_weight = (proj.index_weights.double() * proj.index_q_scale.double())[:, :, None]
    scores = ordered_sum(torch.relu(dots) * head_weight, dim=1)
    return scores * keys_scale.double()[None, :]


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
    selected = latent_keys[topk_positions.clamp(min=0)]  # [nq, topk, kv_dim]
    logits = ordered_dot(q[:, :, None, :], selected[:, None, :, :]) * attention_scale(cfg)
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    probs = softmax_fp64(logits, dim=-1).float()  # [nq, heads, topk]
    values = selected[:, None, :, : cfg.kv_lora_rank]  # [nq, 1, topk, kv_lora_rank]
    out = ordered_sum(probs[..., None] * values, dim=2)  # [nq, heads, kv_lora_rank]
    return out.reshape(q.shape[0], cfg.num_heads * cfg.kv_lora_rank)


def attend_request(
    cfg: ModelConfig,
    proj: Projections,
    query_positions: Tensor,
    latent_keys: Tensor,
    index_keys: Tensor,
    index_keys_scale: Tensor,
) -> tuple[Tensor, Tensor]:
    """Indexer top-k and sparse attention for queries of one request.

    Args:
        proj: projections of ``nq`` queries of the request.
        query_positions: ``[nq]`` their logical positions.
        latent_keys: ``[num_keys, kv_dim]`` the request's latent KV, row = logical position.
        index_keys: ``[num_keys, index_head_dim]`` its stored index K.
        index_keys_scale: ``[num_keys]``.

    Returns:
        ``(attn [nq, num_heads * kv_lora_rank], topk_positions [nq, index_topk])``.
    """
    scores = index_scores(proj, index_keys, index_keys_scale)
    topk_positions = select_topk(scores, query_positions, cfg.index_topk)
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
