"""Model weights per rank, placed the way SGLang places them; :func:`weights_per_rank`.

SGLang's groups (``server_args.py``, ``layers/dp_attention.py``):

- the attention TP group is ``attn_tp_size = tp_size // dp_attention // attn_cp_size``:
  attention-CP ranks and attention-DP groups are carved out of the TP group (``--attn-cp-size``
  does so even without prefill CP), and each holds a whole copy of the attention weights of
  its attention TP shard;
- routed experts are split over all ``tp_size`` ranks whatever ``ep_size`` (EP gives each
  rank whole experts, ``tp_size / ep_size`` MoE TP slices each; both hold ``1/tp_size``);
- dense MLPs, shared experts and the LM head are split over ``tp_size``; the input
  embeddings too, except under DP attention, where every rank holds them whole;
- ``q_a_proj``, ``kv_a_proj_with_mqa``, the indexer's projections, norms and routers are
  replicated.

Bytes: bf16 is 2 bytes a parameter; fp8 is 1 byte plus one fp32 scale per 128x128 block,
charged as ``ceil(params / 16384) * 4`` bytes on each rank's shard.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cpkv_core.config import ModelConfig, WeightDtype, WeightSpec

FP8_BLOCK_ELEMENTS = 128 * 128
"""Weights sharing one fp32 scale in DeepSeek's FP8 checkpoints (a 128x128 block)."""
FP8_SCALE_BYTES = 4
"""Bytes of one fp32 block scale."""


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """How one model instance is spread over ranks, in SGLang's terms.

    Invariant: ``tp_size`` is a multiple of ``ep_size`` and of ``dp_attention * cp_size``.
    """

    tp_size: int
    """Ranks of the model instance (SGLang's ``--tp``: the world size, not the real TP)."""
    ep_size: int
    """Expert-parallel ranks (``--ep-size``); 1 means experts are TP-sliced."""
    dp_attention: int
    """Attention-DP groups (``--dp`` with ``--enable-dp-attention``); 1 means off."""
    cp_size: int
    """CP ranks sharing a prefill chunk and its KV (prefill CP); 1 means CP off."""
    attn_cp_size: int = 0
    """Attention-CP ranks carved out of TP (``--attn-cp-size``); 0 means :attr:`cp_size`."""

    @property
    def attn_cp(self) -> int:
        """The attention-CP group size: :attr:`attn_cp_size`, or :attr:`cp_size`."""
        return self.attn_cp_size or self.cp_size

    @property
    def attn_tp_size(self) -> int:
        """Ranks that split one copy of the attention weights by heads."""
        return self.tp_size // self.dp_attention // self.attn_cp

    def to_json(self) -> dict[str, int]:
        """The sizes, and the attention TP size they leave."""
        return asdict(self) | {"attn_cp_size": self.attn_cp, "attn_tp_size": self.attn_tp_size}


def parallel_layout(
    tp_size: int, ep_size: int, dp_attention: int, cp_size: int, attn_cp_size: int | None = None
) -> ParallelLayout:
    """Checks the sizes the way SGLang does and returns the layout.

    Raises:
        ValueError: a size below 1, or sizes that do not divide ``tp_size``.
    """
    sizes = {"cp_size": cp_size, "dp_attention": dp_attention, "tp_size": tp_size}
    for name, value in (*sizes.items(), ("ep_size", ep_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1 (1 means off), got {value}")
    if tp_size % ep_size:
        raise ValueError(
            f"ep_size must divide tp_size (SGLang splits experts over the TP ranks), got "
            f"tp_size={tp_size} ep_size={ep_size}; set --ep-size to a divisor of {tp_size}"
        )
    attn_cp = attn_cp_size or cp_size
    if tp_size % (dp_attention * attn_cp):
        raise ValueError(
            f"tp_size must be a multiple of dp_attention x cp_size (SGLang carves CP ranks and "
            f"attention-DP groups out of the TP group), got tp_size={tp_size} "
            f"dp_attention={dp_attention} cp_size={attn_cp}; set --tp-size to "
            f"{dp_attention * attn_cp} or a multiple of it"
        )
    return ParallelLayout(tp_size, ep_size, dp_attention, cp_size, attn_cp_size or 0)


@dataclass(frozen=True, slots=True)
class WeightGroup:
    """One group of parameters and the bytes a rank holds of it."""

    name: str
    params: int
    """Parameters of the group over the whole model."""
    split: int
    """Ranks that split the group; each holds ``ceil(params / split)``. 1 means whole."""
    dtype: WeightDtype
    bytes_per_rank: int

    def to_json(self) -> dict[str, Any]:
        """The group as in ``cpkv plan --json``."""
        fields = asdict(self)
        return {"group": fields.pop("name")} | fields | {"dtype": str(self.dtype)}


@dataclass(frozen=True, slots=True)
class RankWeights:
    """The weights one rank holds. Invariant: ``bytes_per_rank`` sums the groups."""

    dtype: WeightDtype
    """Dtype of the linear layers."""
    groups: tuple[WeightGroup, ...]
    """Embeddings, attention, dense MLP, experts, head: each with its split and bytes."""

    @property
    def bytes_per_rank(self) -> int:
        """Bytes of weights on one rank."""
        return sum(group.bytes_per_rank for group in self.groups)

    def to_json(self) -> dict[str, Any]:
        """Total and per-group bytes."""
        return {
            "dtype": str(self.dtype),
            "bytes_per_rank": self.bytes_per_rank,
            "groups": [group.to_json() for group in self.groups],
        }


def shard_bytes(params: int, split: int, dtype: WeightDtype) -> int:
    """Bytes of one rank's ``ceil(params / split)`` parameters stored as ``dtype``."""
    shard = -(-params // split)
    if dtype is WeightDtype.BF16:
        return 2 * shard
    return shard + -(-shard // FP8_BLOCK_ELEMENTS) * FP8_SCALE_BYTES


def weights_per_rank(
    model: ModelConfig, layout: ParallelLayout, dtype: WeightDtype | None = None
) -> RankWeights:
    """The weights one rank of ``layout`` holds.

    Args:
        model: a preset with parameter counts (``model.weights``).
        layout: the parallel sizes.
        dtype: the linear layers' dtype; None takes the preset's published one.

    Raises:
        ValueError: the preset carries no parameter counts.
    """
    spec = model.weights
    if spec is None:
        raise ValueError(f"model preset {model.name!r} carries no parameter counts to plan with")
    linear = spec.linear_dtype if dtype is None else dtype
    return RankWeights(linear, _groups(spec, layout, linear))


def _groups(
    spec: WeightSpec, layout: ParallelLayout, linear: WeightDtype
) -> tuple[WeightGroup, ...]:
    tp, bf16 = layout.tp_size, WeightDtype.BF16
    embed_split = 1 if layout.dp_attention > 1 else tp
    rows = (
        ("routed experts", spec.routed_expert_params, tp, linear),
        ("attention (sharded)", spec.attention_sharded_params, layout.attn_tp_size, linear),
        ("attention (replicated)", spec.attention_replicated_params, 1, linear),
        ("dense MLP + shared experts", spec.dense_mlp_params, tp, linear),
        ("embeddings", spec.embedding_params, embed_split, bf16),
        ("LM head", spec.lm_head_params, tp, bf16),
        ("norms + routers", spec.small_params, 1, bf16),
    )
    return tuple(
        WeightGroup(name, params, split, dtype, shard_bytes(params, split, dtype))
        for name, params, split, dtype in rows
    )
