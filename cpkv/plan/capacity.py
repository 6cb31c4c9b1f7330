"""KV capacity of a CP deployment per rank, weights counted; the entry point is
:func:`plan_capacity`. Pure integer arithmetic, no torch; ``docs/capacity.md`` works one
deployment by hand.

Per rank, in order:

1. **weights** (:mod:`cpkv.plan.weights`): the preset's parameter counts placed as SGLang
   places them for ``tp_size``, ``ep_size``, ``dp_attention`` and ``cp_size``;
2. **KV pool** = ``gpu x mem_fraction_static - weights`` (:mod:`cpkv.plan.memory_budget`);
3. **level >= 2 scratch**: the materialization buffers of one layer, taken from the pool
   (:func:`scratch_tokens`): under ``gather`` the send slots plus the gathered view, padded
   to the busiest owner; under ``peer-read`` the view alone, unpadded; twice that with
   ``materialize_prefetch`` (two buffers alternate by layer);
4. **tokens** = pool // ``B`` rounded down to whole pages, ``B`` being one token's bytes
   over all layers (:mod:`cpkv.plan.kv_bytes`).

Level 0 (replicated) stores every token on every rank. Levels >= 2 store a page only on
its owner (``page % cp_size``), so the CP group caches ``cp_size`` times what one pool
holds; levels 3..5 store what level 2 stores.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from cpkv.plan.inputs import PlanInputs
from cpkv.plan.kv_bytes import KvCacheDtype, kv_bytes_per_token_per_layer
from cpkv.plan.memory_budget import MIB_PER_GIB, MemoryBudget, memory_budget
from cpkv.plan.weights import ParallelLayout, RankWeights, parallel_layout, weights_per_rank
from cpkv_core.config import MaterializeMode, ModelConfig, WeightDtype
from cpkv_core.mla_presets import plan_preset
from flags.sglang.memory import planned_memory
from phases import PhaseId

REPLICATED_LEVEL = 0
"""The phase-0 baseline: every CP rank stores every token."""
SHARDED_LEVEL = int(PhaseId.SHARDED_KV)
"""The first sharded level; levels 3..5 store exactly what level 2 stores."""


@dataclass(frozen=True, slots=True)
class LevelCapacity:
    """KV memory and token capacity of one level.

    Invariant: ``tokens_per_rank`` is a whole number of pages and ``tokens_per_deployment``
    is ``tokens_per_rank`` (replicated) or ``cp_size * tokens_per_rank`` (sharded).
    """

    level: int
    """0 for replicated KV, 2 for sharded KV (and 3..5, which store the same)."""
    kv_bytes_per_token_per_rank: float
    """Bytes one logical token costs each rank, all layers: ``B`` or ``B / cp_size``."""
    scratch_bytes_per_rank: int
    """Bytes of the materialization buffer taken from the pool; 0 at level 0."""
    kv_pool_bytes_per_rank: int
    """Bytes left for KV pages: static share less weights less scratch."""
    tokens_per_rank: int
    """Tokens whose KV one rank's pool stores, rounded down to whole pages."""
    tokens_per_deployment: int
    """Logical tokens the CP group caches together."""
    max_request_tokens: int
    """The longest context one request can hold at this level."""
    max_request_limit: str
    """What sets it: ``kv_pool``, ``max_view_tokens`` or ``model_context``."""

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form: the fields, in order (keys as in ``docs/capacity.md``)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """The capacity of one model on one deployment at level 0 and at levels >= 2.

    Invariant: both levels hold at least one page per rank, so ``capacity_gain`` is defined.
    """

    inputs: PlanInputs
    layout: ParallelLayout
    budget: MemoryBudget
    weights: RankWeights
    bytes_per_token_per_layer: int
    """One token in one layer: latent plus index K and scale."""
    num_layers: int
    max_context_len: int
    """The model's longest sequence (``max_position_embeddings``)."""
    replicated: LevelCapacity
    sharded: LevelCapacity

    @property
    def bytes_per_token_all_layers(self) -> int:
        """``B``: one token over all layers."""
        return self.bytes_per_token_per_layer * self.num_layers

    @property
    def kv_budget_bytes_per_rank(self) -> int:
        """The static share less the weights: the level-0 pool."""
        return self.budget.static_bytes - self.weights.bytes_per_rank

    @property
    def levels(self) -> tuple[LevelCapacity, LevelCapacity]:
        """Level 0, then level 2."""
        return (self.replicated, self.sharded)

    @property
    def capacity_gain(self) -> float:
        """Deployment tokens at level 2 over those at level 0: ``cp_size`` less the scratch."""
        return self.sharded.tokens_per_deployment / self.replicated.tokens_per_deployment

    def to_json(self) -> dict[str, Any]:
        """The stable JSON document of ``cpkv plan --json``."""
        return {
            "model": self.inputs.model,
            **self.layout.to_json(),
            "page_size": self.inputs.page_size,
            "gpu_mem_gib": self.inputs.gpu_mem_gib,
            "kv_cache_dtype": str(self.inputs.kv_cache_dtype),
            "max_view_tokens": self.inputs.max_view_tokens,
            "materialize": str(self.inputs.materialize),
            "materialize_prefetch": self.inputs.materialize_prefetch,
            "max_context_len": self.max_context_len,
            "memory": self.budget.to_json(),
            "weights": self.weights.to_json(),
            "kv_budget_bytes_per_rank": self.kv_budget_bytes_per_rank,
            "bytes_per_token_per_layer": self.bytes_per_token_per_layer,
            "bytes_per_token_all_layers": self.bytes_per_token_all_layers,
            "levels": [level.to_json() for level in self.levels],
            "capacity_gain": self.capacity_gain,
        }


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:,.2f} GiB"


def _whole_pages(num_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """Tokens that fit in ``num_bytes``, rounded down to whole pages; 0 when negative."""
    if num_bytes <= 0:
        return 0
    return num_bytes // bytes_per_token // page_size * page_size


def _longest_request(limits: dict[str, int]) -> tuple[int, str]:
    """The smallest limit and its name (first of equals, in ``limits`` order)."""
    name = min(limits, key=lambda key: limits[key])
    return limits[name], name


def _budget(inputs: PlanInputs, layout: ParallelLayout) -> MemoryBudget:
    sglang = inputs.sglang_memory
    if sglang is None:
        sglang = planned_memory(
            inputs.gpu_mem_gib * MIB_PER_GIB,
            layout.tp_size,
            layout.dp_attention,
            inputs.chunked_prefill_size,
            inputs.cuda_graph_max_bs,
        )
        # NOTE: each attention-DP group prefills its share of the chunk (parallel_hook.py).
        chunk = sglang.chunked_prefill_size
        sglang = replace(sglang, chunked_prefill_size=chunk // layout.dp_attention)
    return memory_budget(
        inputs.gpu_mem_gib, inputs.mem_fraction_static, inputs.reserve_gib, sglang=sglang
    )


def _check_sizes(inputs: PlanInputs) -> None:
    if not (math.isfinite(inputs.gpu_mem_gib) and inputs.gpu_mem_gib > 0):
        raise ValueError(f"gpu_mem_gib must be a finite number > 0, got {inputs.gpu_mem_gib}")
    if inputs.page_size < 1:
        raise ValueError(f"page_size must be >= 1 token, got {inputs.page_size}")
    if inputs.max_view_tokens < 1:
        raise ValueError(f"max_view_tokens must be >= 1, got {inputs.max_view_tokens}")


def _check_weights_fit(weights: RankWeights, budget: MemoryBudget, layout: ParallelLayout) -> int:
    """The level-0 pool; refuses when the weights alone fill the static share."""
    pool = budget.static_bytes - weights.bytes_per_rank
    fp8_hint = (
        ", load fp8 weights (--weight-dtype fp8)," if weights.dtype is WeightDtype.BF16 else ""
    )
    if pool <= 0:
        raise ValueError(
            f"the weights alone do not fit: {_gib(weights.bytes_per_rank)} per rank "
            f"({weights.dtype}, tp_size={layout.tp_size}, attn_tp_size={layout.attn_tp_size}) "
            f"against a static share of {_gib(budget.static_bytes)} (gpu "
            f"{_gib(budget.gpu_bytes)} x mem_fraction_static {budget.mem_fraction_static:g}); "
            f"raise --tp-size{fp8_hint} or plan a larger GPU"
        )
    return pool


def _replicated(pool: int, per_token: int, page: int, context: int) -> LevelCapacity:
    tokens = _whole_pages(pool, per_token, page)
    if tokens == 0:
        raise ValueError(
            f"the KV pool per rank ({_gib(pool)} after weights) does not hold one page "
            f"({page} tokens x {per_token} B); raise --gpu-mem-gib or --mem-fraction-static"
        )
    longest = _longest_request({"kv_pool": tokens, "model_context": context})
    return LevelCapacity(REPLICATED_LEVEL, float(per_token), 0, pool, tokens, tokens, *longest)


def scratch_tokens(
    view_tokens: int, cp_size: int, page_size: int, materialize: MaterializeMode
) -> int:
    """Token rows of one layer's level >= 2 scratch for a view of ``view_tokens`` tokens.

    ``gather``: each owner sends ``max_pages = ceil(pages / cp_size)`` page slots and every
    rank receives ``cp_size x max_pages`` of them, so ``(cp_size + 1) x max_pages`` pages.
    ``peer-read``: the pages read, unpadded, and no send slots.
    """
    pages = -(-view_tokens // page_size)
    if materialize is MaterializeMode.PEER_READ:
        return pages * page_size
    return (cp_size + 1) * -(-pages // cp_size) * page_size


def _sharded(
    inputs: PlanInputs, pool: int, per_layer: int, model: ModelConfig, cp: int
) -> LevelCapacity:
    per_token, view = per_layer * model.num_layers, inputs.max_view_tokens
    buffers = 2 if inputs.materialize_prefetch else 1
    rows = buffers * scratch_tokens(view, cp, inputs.page_size, inputs.materialize)
    scratch = rows * per_layer
    tokens = _whole_pages(pool - scratch, per_token, inputs.page_size)
    if tokens == 0:
        raise ValueError(
            f"the KV pool per rank ({_gib(pool)} after weights) does not cover the level >= 2 "
            f"materialization scratch ({rows} tokens x {per_layer} B, one layer, "
            f"{inputs.materialize}, {buffers} buffer(s)) plus one "
            f"page; raise --gpu-mem-gib or --mem-fraction-static, or lower --max-view-tokens"
        )
    limits = {
        "kv_pool": cp * tokens,
        "max_view_tokens": view,
        "model_context": model.max_context_len,
    }
    return LevelCapacity(
        SHARDED_LEVEL,
        per_token / cp,
        scratch,
        pool - scratch,
        tokens,
        cp * tokens,
        *_longest_request(limits),
    )


def plan_capacity(inputs: PlanInputs) -> CapacityPlan:
    """KV memory and token capacity per rank and per deployment, at level 0 and level >= 2.

    Raises:
        ValueError: an input out of range, weights that do not fit the static share, or a
            pool that does not hold one page at level 0, or the scratch plus one page at
            level >= 2.
    """
    model = inputs.model_dims or plan_preset(inputs.model)
    _check_sizes(inputs)
    if model.has_indexer and inputs.kv_cache_dtype is KvCacheDtype.FP8_E5M2:
        raise ValueError(
            f"kv_cache_dtype fp8_e5m2: {model.name} is a DSA model, whose pools store bf16 or "
            "fp8_e4m3 (SGLang refuses fp8_e5m2 for it, overrides.py); use --kv-cache-dtype "
            "fp8_e4m3"
        )
    attn_cp = inputs.attn_cp_size or inputs.cp_size
    tp_size = inputs.tp_size or inputs.dp_attention * attn_cp
    layout = parallel_layout(
        tp_size, inputs.ep_size, inputs.dp_attention, inputs.cp_size, inputs.attn_cp_size
    )
    budget = _budget(inputs, layout)
    weights = weights_per_rank(model, layout, inputs.weight_dtype)
    pool = _check_weights_fit(weights, budget, layout)
    per_layer = kv_bytes_per_token_per_layer(model, inputs.kv_cache_dtype)
    per_token = per_layer * model.num_layers
    return CapacityPlan(
        inputs=inputs,
        layout=layout,
        budget=budget,
        weights=weights,
        bytes_per_token_per_layer=per_layer,
        num_layers=model.num_layers,
        max_context_len=model.max_context_len,
        replicated=_replicated(pool, per_token, inputs.page_size, model.max_context_len),
        sharded=_sharded(inputs, pool, per_layer, model, layout.cp_size),
    )
