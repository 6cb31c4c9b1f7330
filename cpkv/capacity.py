"""KV memory and token capacity of a CP deployment, replicated (level 0) vs sharded (>= 2).

Pure integer arithmetic, no torch; the entry point is :func:`plan_capacity`. Every figure
is defined in ``docs/capacity.md``; in short:

- ``B`` = bytes one token's KV occupies over all layers in production storage: per layer
  the MLA latent KV (``kv_lora_rank + qk_rope_head_dim`` elements in bf16), the indexer
  key (``index_head_dim`` bytes in fp8 e4m3) and its fp32 scale, times ``num_layers``.
  Every preset is planned with production storage, ``tiny`` included (its test-vehicle
  pools store fp32 latent).
- KV budget per rank = ``gpu_mem_gib * 2**30 * mem_fraction`` bytes, rounded down.
- Level 0 (replicated): every rank stores every token, so a rank and the deployment both
  hold ``budget // B`` tokens, rounded down to whole pages.
- Level >= 2 (sharded, ``owner(page) = page % cp_size``): a rank stores only the pages it
  owns, ``(budget - scratch) // B`` tokens rounded down to whole pages, and the deployment
  holds ``cp_size`` times that. ``scratch`` is the full-view materialization buffer: one
  layer's bytes for ``max_view_tokens`` tokens (the buffer is reused layer by layer).
  Phases 3..5 change the bytes moved, not the bytes stored, so they share level 2's figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from cpkv_core.config import IndexKDtype, ModelConfig
from cpkv_core.runtime import kv_bytes_per_token
from phases import PhaseId

GIB = 2**30
"""Bytes in one GiB."""
BF16_ITEMSIZE = 2
"""Bytes per MLA latent element in production storage (bf16)."""
PRODUCTION_INDEX_K_DTYPE = IndexKDtype.FP8_E4M3
"""Index K storage of the production models: fp8 e4m3 plus one fp32 scale per token."""
DEFAULT_MEM_FRACTION = 0.85
"""Share of GPU memory given to the KV pool (weights and activations are budgeted elsewhere)."""
DEFAULT_PAGE_SIZE = 64
"""Tokens per KV page of the NSA models."""
DEFAULT_MAX_VIEW_TOKENS = 131072
"""Tokens of the largest materialized view: one 128k-token request."""
REPLICATED_LEVEL = 0
"""The phase-0 baseline: every CP rank stores every token."""
SHARDED_LEVEL = int(PhaseId.SHARDED_KV)
"""The first sharded level; levels 3..5 store exactly what level 2 stores."""


@dataclass(frozen=True, slots=True)
class LevelCapacity:
    """KV memory and token capacity of one level, per rank and per deployment.

    Invariant: ``tokens_per_rank`` is a whole number of pages and
    ``tokens_per_deployment`` is ``tokens_per_rank`` (replicated) or
    ``cp_size * tokens_per_rank`` (sharded).
    """

    level: int
    """0 for replicated KV, 2 for sharded KV (and 3..5, which store the same)."""
    kv_bytes_per_token_per_rank: float
    """Bytes one logical token costs each rank, all layers: ``B`` or ``B / cp_size``."""
    scratch_bytes_per_rank: int
    """Bytes of the full-view materialization buffer taken from the KV budget; 0 at level 0."""
    tokens_per_rank: int
    """Tokens whose KV one rank's pool stores, rounded down to whole pages."""
    tokens_per_deployment: int
    """Logical tokens the CP group can cache together."""

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (keys as in ``docs/capacity.md``)."""
        return {
            "level": self.level,
            "kv_bytes_per_token_per_rank": self.kv_bytes_per_token_per_rank,
            "scratch_bytes_per_rank": self.scratch_bytes_per_rank,
            "tokens_per_rank": self.tokens_per_rank,
            "tokens_per_deployment": self.tokens_per_deployment,
        }


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """The capacity of one model on one deployment at level 0 and at levels >= 2.

    Invariant: both levels hold at least one page per rank, so ``capacity_gain`` is defined.
    """

    model: str
    """Model preset name."""
    cp_size: int
    """CP ranks sharing the KV."""
    page_size: int
    """Tokens per KV page."""
    gpu_mem_gib: float
    """GPU memory per rank, in GiB (2**30 bytes)."""
    mem_fraction: float
    """Share of GPU memory given to the KV pool, in (0, 1]."""
    max_view_tokens: int
    """Tokens of the largest materialized view one batch reads in one layer."""
    kv_budget_bytes_per_rank: int
    """``gpu_mem_gib * 2**30 * mem_fraction``, rounded down to a byte."""
    bytes_per_token_per_layer: int
    """Production bytes of one token in one layer: bf16 latent, fp8 index K, fp32 scale."""
    bytes_per_token_all_layers: int
    """``bytes_per_token_per_layer * num_layers``: ``B`` in the docs."""
    replicated: LevelCapacity
    """Level 0."""
    sharded: LevelCapacity
    """Level 2 (and 3..5)."""

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
            "model": self.model,
            "cp_size": self.cp_size,
            "page_size": self.page_size,
            "gpu_mem_gib": self.gpu_mem_gib,
            "mem_fraction": self.mem_fraction,
            "max_view_tokens": self.max_view_tokens,
            "kv_budget_bytes_per_rank": self.kv_budget_bytes_per_rank,
            "bytes_per_token_per_layer": self.bytes_per_token_per_layer,
            "bytes_per_token_all_layers": self.bytes_per_token_all_layers,
            "levels": [level.to_json() for level in self.levels],
            "capacity_gain": self.capacity_gain,
        }


def production_bytes_per_token_per_layer(model: ModelConfig) -> int:
    """Bytes one token occupies in one layer in production storage.

    ``kv_dim * 2`` (bf16 latent) ``+ index_head_dim`` (fp8 index K) ``+ 4`` (fp32 scale):
    1,284 for DeepSeek-V3.2 and GLM-5.
    """
    return kv_bytes_per_token(model, PRODUCTION_INDEX_K_DTYPE, latent_itemsize=BF16_ITEMSIZE)


def kv_budget_bytes(gpu_mem_gib: float, mem_fraction: float) -> int:
    """``gpu_mem_gib * 2**30 * mem_fraction`` bytes, rounded down.

    NOTE: computed on the decimal values as written (``0.85`` is 17/20), so the figure is
    the one a person gets by hand, not one byte below it from binary rounding.
    """
    exact = Fraction(repr(gpu_mem_gib)) * GIB * Fraction(repr(mem_fraction))
    return math.floor(exact)


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:,.1f} MiB"


def _whole_pages(num_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """Tokens that fit in ``num_bytes``, rounded down to whole pages; 0 when negative."""
    if num_bytes <= 0:
        return 0
    return num_bytes // bytes_per_token // page_size * page_size


def _check_inputs(
    cp_size: int, page_size: int, gpu_mem_gib: float, mem_fraction: float, max_view_tokens: int
) -> None:
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1 (1 means CP off), got {cp_size}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1 token, got {page_size}")
    if not (math.isfinite(gpu_mem_gib) and gpu_mem_gib > 0):
        raise ValueError(f"gpu_mem_gib must be a finite number > 0, got {gpu_mem_gib}")
    if not 0 < mem_fraction <= 1:
        raise ValueError(
            f"mem_fraction must be in (0, 1] (the share of GPU memory for the KV pool), "
            f"got {mem_fraction}"
        )
    if max_view_tokens < 1:
        raise ValueError(f"max_view_tokens must be >= 1, got {max_view_tokens}")


def plan_capacity(
    model: ModelConfig,
    cp_size: int,
    page_size: int = DEFAULT_PAGE_SIZE,
    gpu_mem_gib: float = 80.0,
    mem_fraction: float = DEFAULT_MEM_FRACTION,
    max_view_tokens: int = DEFAULT_MAX_VIEW_TOKENS,
) -> CapacityPlan:
    """KV memory and token capacity per rank and per deployment, at level 0 and level >= 2.

    Args:
        model: model dimensions; planned with production storage whatever the preset.
        cp_size: CP ranks; at level >= 2 each stores the pages ``page % cp_size`` names it.
        page_size: tokens per KV page; capacities are rounded down to whole pages.
        gpu_mem_gib: GPU memory per rank, in GiB.
        mem_fraction: share of GPU memory given to the KV pool, in (0, 1].
        max_view_tokens: tokens of the largest full view materialization builds for one
            layer at level >= 2; its bytes are taken from the KV budget.

    Raises:
        ValueError: an input is out of range, or the budget does not hold one page at
            level 0, or the scratch plus one page at level >= 2.
    """
    _check_inputs(cp_size, page_size, gpu_mem_gib, mem_fraction, max_view_tokens)
    per_layer = production_bytes_per_token_per_layer(model)
    per_token = per_layer * model.num_layers
    budget = kv_budget_bytes(gpu_mem_gib, mem_fraction)
    page_bytes = page_size * per_token
    replicated_tokens = _whole_pages(budget, per_token, page_size)
    if replicated_tokens == 0:
        raise ValueError(
            f"KV budget per rank {_mib(budget)} does not hold one page ({_mib(page_bytes)} = "
            f"{page_size} tokens x {per_token} B); raise gpu_mem_gib or mem_fraction"
        )
    scratch = max_view_tokens * per_layer
    sharded_tokens = _whole_pages(budget - scratch, per_token, page_size)
    if sharded_tokens == 0:
        raise ValueError(
            f"KV budget per rank {_mib(budget)} does not cover the level >= 2 materialization "
            f"scratch {_mib(scratch)} ({max_view_tokens} view tokens x {per_layer} B, one "
            f"layer) plus one page ({_mib(page_bytes)}); raise gpu_mem_gib or mem_fraction, "
            f"or lower max_view_tokens"
        )
    return CapacityPlan(
        model=model.name,
        cp_size=cp_size,
        page_size=page_size,
        gpu_mem_gib=gpu_mem_gib,
        mem_fraction=mem_fraction,
        max_view_tokens=max_view_tokens,
        kv_budget_bytes_per_rank=budget,
        bytes_per_token_per_layer=per_layer,
        bytes_per_token_all_layers=per_token,
        replicated=LevelCapacity(
            level=REPLICATED_LEVEL,
            kv_bytes_per_token_per_rank=float(per_token),
            scratch_bytes_per_rank=0,
            tokens_per_rank=replicated_tokens,
            tokens_per_deployment=replicated_tokens,
        ),
        sharded=LevelCapacity(
            level=SHARDED_LEVEL,
            kv_bytes_per_token_per_rank=per_token / cp_size,
            scratch_bytes_per_rank=scratch,
            tokens_per_rank=sharded_tokens,
            tokens_per_deployment=cp_size * sharded_tokens,
        ),
    )
