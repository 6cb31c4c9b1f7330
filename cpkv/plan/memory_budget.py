"""The static memory budget of a rank, with SGLang's meaning of ``--mem-fraction-static``.

SGLang splits a GPU of ``T`` bytes in two (``server_args.py: _handle_gpu_memory_settings``
and ``model_runner.py: profile_max_num_token``):

- **static**, ``T x mem_fraction_static``: the weights and the KV pool (and here the
  level >= 2 materialization scratch, a static buffer too). The pool is what is left after
  the weights: ``T x mem_fraction_static - weights``.
- **reserve**, ``T x (1 - mem_fraction_static)``: activations, CUDA graphs and other
  runtime buffers.

When ``--mem-fraction-static`` is not given, SGLang derives it from a reserve estimate in
MiB: ``512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x cuda_graph_max_bs + tp_size / 8 x
1024`` (plus ``3 x cuda_graph_max_bs x dp`` under DP attention, and ``1.5 x
cuda_graph_max_bs x dp`` more above 300), at least 10 GiB on GPUs above 60 GiB, and
``mem_fraction_static = round((T - reserve) / T, 3)``. :func:`memory_budget` does the same,
or takes the fraction or the reserve as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

GIB = 2**30
"""Bytes in one GiB."""
MIB_PER_GIB = 1024
"""MiB in one GiB (SGLang's reserve estimate is in MiB)."""
LARGE_GPU_MIB = 60 * 1024
"""SGLang keeps at least ``MIN_LARGE_GPU_RESERVE_MIB`` on GPUs above this size."""
MIN_LARGE_GPU_RESERVE_MIB = 10 * 1024
"""The floor of SGLang's reserve on GPUs above 60 GiB."""
B200_CLASS_MIB = 160 * 1024
"""From this size up SGLang defaults to a 16384-token chunk and 512 CUDA-graph requests."""
DEFAULT_MAX_PREFILL_TOKENS = 16384
"""SGLang's ``--max-prefill-tokens``: the activation estimate without chunked prefill."""


class FractionSource(StrEnum):
    """Where ``mem_fraction_static`` came from."""

    GIVEN = "given"
    """``--mem-fraction-static`` (or the SGLang command's)."""
    RESERVE = "reserve"
    """``1 - reserve / gpu_mem`` from ``--reserve-gib``."""
    SGLANG_DEFAULT = "sglang-default"
    """SGLang's own estimate of the reserve, as it derives the fraction when none is given."""


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """One rank's memory: the static share (weights + KV) and the reserve.

    Invariant: ``static_bytes + reserve_bytes == gpu_bytes``.
    """

    gpu_bytes: int
    """GPU memory of one rank."""
    mem_fraction_static: float
    """The share of ``gpu_bytes`` for weights and the KV pool (SGLang's meaning)."""
    source: FractionSource
    static_bytes: int
    """``gpu_bytes x mem_fraction_static``, rounded down."""
    chunked_prefill_size: int
    """Tokens per prefill chunk that the default reserve was sized for."""
    cuda_graph_max_bs: int
    """Largest CUDA-graph batch the default reserve was sized for."""

    @property
    def reserve_bytes(self) -> int:
        """Left for activations, CUDA graphs and runtime buffers."""
        return self.gpu_bytes - self.static_bytes

    def to_json(self) -> dict[str, Any]:
        """The budget as in ``cpkv plan --json``."""
        return {
            "gpu_bytes": self.gpu_bytes,
            "mem_fraction_static": self.mem_fraction_static,
            "mem_fraction_source": str(self.source),
            "static_bytes": self.static_bytes,
            "reserve_bytes": self.reserve_bytes,
            "chunked_prefill_size": self.chunked_prefill_size,
            "cuda_graph_max_bs": self.cuda_graph_max_bs,
        }


def sglang_default_chunk_and_graph_bs(gpu_mem_gib: float, tp_size: int) -> tuple[int, int]:
    """SGLang's defaults for ``--chunked-prefill-size`` and ``--cuda-graph-max-bs``.

    From 60 to 160 GiB (H100, H200): 8192 tokens and 256 requests (512 at ``tp_size >= 4``);
    from 160 GiB (B200): 16384 and 512. Smaller GPUs get other values in SGLang: pass them.
    """
    if gpu_mem_gib * MIB_PER_GIB >= B200_CLASS_MIB:
        return 16384, 512
    return 8192, 256 if tp_size < 4 else 512


def sglang_reserve_mib(
    gpu_mem_gib: float,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int,
    tp_size: int,
    dp_attention: int,
) -> float:
    """SGLang's estimate of the memory outside the static share, in MiB.

    A ``chunked_prefill_size`` below 1 means chunked prefill is off (SGLang's ``-1``): the
    activations are then sized for ``--max-prefill-tokens`` (16384).
    """
    if cuda_graph_max_bs < 0:
        raise ValueError(f"cuda_graph_max_bs must be >= 0, got {cuda_graph_max_bs}")
    activation_tokens = (
        chunked_prefill_size if chunked_prefill_size > 0 else DEFAULT_MAX_PREFILL_TOKENS
    )
    reserve = 512 + max(activation_tokens, 2048) * 1.5 + cuda_graph_max_bs * 2
    reserve += tp_size / 8 * 1024
    if dp_attention > 1:
        reserve += cuda_graph_max_bs * dp_attention * 3
        if cuda_graph_max_bs > 300:
            reserve += cuda_graph_max_bs * dp_attention * 1.5
    if gpu_mem_gib * MIB_PER_GIB > LARGE_GPU_MIB:
        reserve = max(reserve, MIN_LARGE_GPU_RESERVE_MIB)
    return reserve


def _exact(value: float) -> Fraction:
    # NOTE: decimal values as written (0.85 is 17/20), so figures match hand arithmetic.
    return Fraction(repr(value))


def memory_budget(
    gpu_mem_gib: float,
    mem_fraction_static: float | None = None,
    reserve_gib: float | None = None,
    *,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int,
    tp_size: int,
    dp_attention: int = 1,
) -> MemoryBudget:
    """The static share of one rank: given, from a reserve, or as SGLang derives it.

    Raises:
        ValueError: both or an out-of-range fraction or reserve, or a bad GPU size.
    """
    if not (math.isfinite(gpu_mem_gib) and gpu_mem_gib > 0):
        raise ValueError(f"gpu_mem_gib must be a finite number > 0, got {gpu_mem_gib}")
    if mem_fraction_static is not None and reserve_gib is not None:
        raise ValueError(
            "give --mem-fraction-static or --reserve-gib, not both: the reserve is what the "
            "fraction leaves, gpu_mem x (1 - mem_fraction_static)"
        )
    gpu = _exact(gpu_mem_gib) * GIB
    if reserve_gib is not None:
        if not (math.isfinite(reserve_gib) and 0 <= reserve_gib < gpu_mem_gib):
            raise ValueError(
                f"reserve_gib must be in [0, gpu_mem_gib={gpu_mem_gib:g}), got {reserve_gib}"
            )
        static = gpu - _exact(reserve_gib) * GIB
        fraction, source = float(static / gpu), FractionSource.RESERVE
    elif mem_fraction_static is not None:
        if not 0 < mem_fraction_static <= 1:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1] (SGLang's share of GPU memory for "
                f"weights and the KV pool), got {mem_fraction_static}"
            )
        fraction, source = mem_fraction_static, FractionSource.GIVEN
        static = gpu * _exact(fraction)
    else:
        gpu_mib = gpu_mem_gib * MIB_PER_GIB
        reserve = sglang_reserve_mib(
            gpu_mem_gib, chunked_prefill_size, cuda_graph_max_bs, tp_size, dp_attention
        )
        fraction = round((gpu_mib - reserve) / gpu_mib, 3)
        if fraction <= 0:
            raise ValueError(
                f"SGLang's reserve estimate {reserve:,.0f} MiB leaves nothing of "
                f"{gpu_mem_gib:g} GiB; pass --mem-fraction-static or --reserve-gib"
            )
        static = gpu * _exact(fraction)
        source = FractionSource.SGLANG_DEFAULT
    return MemoryBudget(
        gpu_bytes=math.floor(gpu),
        mem_fraction_static=fraction,
        source=source,
        static_bytes=math.floor(static),
        chunked_prefill_size=chunked_prefill_size,
        cuda_graph_max_bs=cuda_graph_max_bs,
    )
