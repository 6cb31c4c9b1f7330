"""The test vehicle's weights: deterministic from the model config's seed, the same on every
rank and every run (``init_weights``), one layer's input projections also side by side
(``LayerWeights.w_project``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from cpkv_core.config import ModelConfig

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
    w_project: Tensor = field(init=False)
    """The five input projections side by side, in ``PROJECTIONS`` order: ``project`` runs
    one ``linear`` over them (each output column sums its own terms in the same order, so
    its bits are those of its own projection's ``linear``), a fifth of the calls."""

    def __post_init__(self) -> None:
        fused = torch.cat([getattr(self, name) for name in PROJECTIONS], dim=1)
        object.__setattr__(self, "w_project", fused)

    def projected(self, out: Tensor) -> tuple[Tensor, ...]:
        """``out = linear(x, w_project)`` cut into the five projections, each contiguous."""
        widths = [getattr(self, name).shape[1] for name in PROJECTIONS]
        return tuple(part.contiguous() for part in torch.split(out, widths, dim=1))


PROJECTIONS = ("w_index_q", "w_index_k", "w_kv", "w_q", "w_index_weights")
"""The input projections of a layer, as ``LayerWeights.w_project`` holds them."""


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
            LayerWeights(
                **{f.name: getattr(layer, f.name).to(device) for f in fields(layer) if f.init}
            )
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
