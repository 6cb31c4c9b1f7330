"""The static memory budget of a rank, with SGLang's meaning of ``--mem-fraction-static``.

SGLang splits a GPU of ``T`` bytes in two (``server_args.py: _handle_gpu_memory_settings``
and ``model_runner.py: profile_max_num_token``):

- **static**, ``T x mem_fraction_static``: the weights and the KV pool (and here the
  level >= 2 materialization scratch, a static buffer too). The pool is what is left after
  the weights: ``T x mem_fraction_static - weights``.
- **reserve**, ``T x (1 - mem_fraction_static)``: activations, CUDA graphs and other
  runtime buffers.

When ``--mem-fraction-static`` is not given, SGLang derives it from a reserve estimate in
MiB (``memory_hook.py``, modelled in :mod:`flags.sglang.memory`): ``512 + 1.5 x
max(chunked_prefill_size, 2048) + tp_size x pp_size / 8 x 1024`` plus the CUDA graphs'
reserve (``2 x max_bs`` for the decode graph, none on a prefill worker; DP attention's
padding), at least 10 GiB on GPUs above 60 GiB, plus DeepEP's buffers, and
``mem_fraction_static = round((T - reserve) / T, 3)``. A PD decode worker sizes its
activations by its running requests instead of the chunk. :func:`memory_budget` takes that
fraction, or the fraction or the reserve as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

from flags.sglang.memory import MemoryDefaults

GIB = 2**30
"""Bytes in one GiB."""
MIB_PER_GIB = 1024
"""MiB in one GiB (SGLang's reserve estimate is in MiB)."""


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
    """Tokens per prefill chunk as the server runs it (an attention-DP group's share, rounded
    to pages for KV sharding); SGLang sizes its default reserve for the chunk before both."""
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


def _exact(value: float) -> Fraction:
    # NOTE: decimal values as written (0.85 is 17/20), so figures match hand arithmetic.
    return Fraction(repr(value))


def memory_budget(
    gpu_mem_gib: float,
    mem_fraction_static: float | None = None,
    reserve_gib: float | None = None,
    *,
    sglang: MemoryDefaults,
) -> MemoryBudget:
    """The static share of one rank: given, from a reserve, or as SGLang derives it.

    Args:
        gpu_mem_gib: the GPU's memory, in GiB.
        mem_fraction_static: the fraction as given, or None.
        reserve_gib: the reserve as given, or None.
        sglang: SGLang's memory defaults for the deployment on this GPU (chunk, decode
            graph size, and the fraction it derives).

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
        derived = sglang.mem_fraction_static
        if derived is None or derived <= 0:
            raise ValueError(
                f"SGLang's reserve estimate {sglang.reserve_mib or 0:,.0f} MiB leaves nothing "
                f"of {gpu_mem_gib:g} GiB; pass --mem-fraction-static or --reserve-gib"
            )
        fraction, source = derived, FractionSource.SGLANG_DEFAULT
        static = gpu * _exact(fraction)
    return MemoryBudget(
        gpu_bytes=math.floor(gpu),
        mem_fraction_static=fraction,
        source=source,
        static_bytes=math.floor(static),
        chunked_prefill_size=sglang.chunked_prefill_size,
        cuda_graph_max_bs=sglang.decode_max_bs,
    )
