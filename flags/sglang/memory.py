"""SGLang 0.5.23's GPU-memory defaults: chunk size, decode CUDA-graph size, static fraction.

``handle_gpu_memory_settings`` (``sglang/srt/arg_groups/memory_hook.py``) runs before the
model overrides, so it sees the command's own parallel sizes and MoE backend. It sets:

- ``chunked_prefill_size`` by GPU memory when unset (8192 on 90-160 GiB: H200);
- the decode CUDA graph's ``max_bs`` when unset (256, or 512 at TP >= 4, on H100/H200),
  capped by ``--max-running-requests``;
- ``mem_fraction_static`` when unset: ``round((gpu - reserve) / gpu, 3)`` with the reserve
  in MiB of :func:`reserve_mib`, less a VLM's vision-tower share
  (:func:`flags.sglang.multimodal.vlm_fraction`).

The CUDA-graph configuration comes first (``cuda_graph_hook.py: parse_cuda_graph_config``,
``apply_cuda_graph_disaggregation_roles``): explicit JSON > per-phase flags > the legacy
``--disable-cuda-graph`` > defaults. A prefill worker captures no decode graph and a decode
worker no prefill graph, unless the command picks that phase's backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flags.sglang.environ import env_bool
from flags.sglang.multimodal import Multimodal, vlm_fraction

H200_MIB = 143771
"""An H200's memory as SGLang reads it (``nvidia-smi --query-gpu=memory.total``), in MiB."""
LARGE_GPU_MIB = 60 * 1024
"""Above this, SGLang keeps a reserve of at least :data:`MIN_RESERVE_MIB`."""
MIN_RESERVE_MIB = 10 * 1024
MLA_PREFILL_GRAPH_MIB = 1.5 * 1024
"""The prefill CUDA graph's reserve for an MLA model, whatever its buckets."""
DEEPEP_MIB = 2 * 1024
"""DeepEP's all-to-all buffers in the decode graph (``reserve_for_deepep_a2a_mb``)."""
BREAKABLE_DEEPEP_MIB = 1024
DEFAULT_MAX_PREFILL_TOKENS = 16384

DISABLED, BREAKABLE, FULL = "disabled", "breakable", "full"
PREFILL_GRAPH_DEFAULT = DISABLED
"""The prefill CUDA graph's default backend. SGLang's ``default_prefill_backend``
(``model_executor/cuda_graph_config.py``) picks ``breakable`` when torch is a CUDA build
(``utils.common.is_cuda``), which its platform override does not change; cpkv follows the
CPU reference pipeline its corpora were resolved on, where it is ``disabled``
(``docs/sglang.md``)."""


@dataclass(frozen=True, slots=True)
class GraphConfig:
    """The CUDA-graph settings the memory rule reads."""

    decode_backend: str
    prefill_backend: str
    decode_max_bs: int | None
    decode_bs: tuple[int, ...] | None
    prefill_max_bs: int | None
    prefill_bs: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class MemoryDefaults:
    """What ``handle_gpu_memory_settings`` resolves for a command."""

    chunked_prefill_size: int
    decode_max_bs: int
    mem_fraction_static: float | None
    """None when the command gives it."""
    reserve_mib: float | None
    """The reserve the fraction leaves, None when the command gives the fraction."""


def graph_config(values: Mapping[str, Any]) -> GraphConfig:
    """The CUDA-graph configuration a command resolves to before the memory rule."""
    decode, prefill = FULL, PREFILL_GRAPH_DEFAULT
    locked: set[str] = set()
    if values["disable_cuda_graph"]:
        decode = prefill = DISABLED
        locked |= {"decode", "prefill"}
    if values["disable_prefill_cuda_graph"]:
        prefill, locked = DISABLED, locked | {"prefill"}
    if values["disable_decode_cuda_graph"]:
        decode, locked = DISABLED, locked | {"decode"}
    if values["cuda_graph_backend_decode"] is not None:
        decode, locked = values["cuda_graph_backend_decode"], locked | {"decode"}
    if values["cuda_graph_backend_prefill"] is not None:
        prefill, locked = values["cuda_graph_backend_prefill"], locked | {"prefill"}
    phases = {
        "decode": {
            "max_bs": values["cuda_graph_max_bs_decode"],
            "bs": values["cuda_graph_bs_decode"],
        },
        "prefill": {
            "max_bs": values["cuda_graph_max_bs_prefill"],
            "bs": values["cuda_graph_bs_prefill"],
        },
    }
    explicit = values["cuda_graph_config"] or {}
    backends = {"decode": decode, "prefill": prefill}
    for phase, settings in explicit.items():
        if phase in phases and isinstance(settings, dict):
            for key, value in settings.items():
                if key == "backend":
                    backends[phase] = value
                    locked.add(phase)
                elif key in phases[phase]:
                    phases[phase][key] = value
    mode = values["disaggregation_mode"]
    if mode == "prefill" and "decode" not in locked:
        backends["decode"] = DISABLED
    if mode == "decode" and "prefill" not in locked:
        backends["prefill"] = DISABLED
    return GraphConfig(
        backends["decode"],
        backends["prefill"],
        phases["decode"]["max_bs"],
        _tuple(phases["decode"]["bs"]),
        phases["prefill"]["max_bs"],
        _tuple(phases["prefill"]["bs"]),
    )


def _tuple(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def default_chunk_and_decode_bs(gpu_mib: float, tp_size: int) -> tuple[int, int]:
    """``chunked_prefill_size`` and decode ``max_bs`` SGLang picks for a GPU size."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if tp_size < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp_size < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp_size < 4 else 512
    return 16384, 512


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """``generate_prefill_cuda_graph_batch_sizes``: the prefill graph's token buckets."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return [s for s in sizes if s <= max_bs]


def memory_defaults(
    values: Mapping[str, Any],
    env: Mapping[str, str],
    mla: bool,
    gpu_mib: float = H200_MIB,
    vlm: Multimodal | None = None,
) -> MemoryDefaults:
    """What ``handle_gpu_memory_settings`` resolves, on a GPU of ``gpu_mib`` MiB.

    Args:
        values: the command's fields as they stand before the model overrides.
        env: the command's environment assignments.
        mla: the model's attention is MLA (``use_mla_backend``).
        gpu_mib: the GPU's memory in MiB.
        vlm: the model's multimodal facts; a model served as a VLM keeps a smaller static
            share (``adjust_mem_fraction_for_vlm``), not rounded again.
    """
    graphs = graph_config(values)
    chunk_default, bs_default = default_chunk_and_decode_bs(gpu_mib, values["tp_size"])
    chunk = values["chunked_prefill_size"]
    chunk = chunk_default if chunk is None else chunk
    decode_bs = graphs.decode_max_bs if graphs.decode_max_bs is not None else bs_default
    running = values["max_running_requests"]
    if graphs.decode_max_bs is None and running is not None and decode_bs > running:
        decode_bs = running
    if graphs.decode_bs is not None:
        decode_bs = max(graphs.decode_bs)
    if values["mem_fraction_static"] is not None:
        return MemoryDefaults(chunk, decode_bs, None, None)
    resolved = dict(values) | {"chunked_prefill_size": chunk}
    reserve = reserve_mib(resolved, env, mla, graphs, decode_bs, gpu_mib)
    fraction = round((gpu_mib - reserve) / gpu_mib, 3)
    if vlm is not None and vlm.served_as_vlm(values):
        post_capture = _post_capture_sizing(resolved, env, mla, graphs)
        fraction = vlm_fraction(fraction, vlm.tower, post_capture, gpu_mib)
    return MemoryDefaults(chunk, decode_bs, fraction, reserve)


def reserve_mib(
    values: Mapping[str, Any],
    env: Mapping[str, str],
    mla: bool,
    graphs: GraphConfig,
    decode_bs: int,
    gpu_mib: float,
) -> float:
    """The memory SGLang keeps outside the static share, in MiB (``memory_hook.py``)."""
    tp_pp = float(values["tp_size"] * values["pp_size"] / 8 * 1024)
    if _post_capture_sizing(values, env, mla, graphs):
        return 1536 + tp_pp
    mode = values["disaggregation_mode"]
    chunk = values["chunked_prefill_size"]
    if mode == "decode":
        running = values["max_running_requests"] or decode_bs or 1
        tokens = max(running * (values["speculative_num_draft_tokens"] or 1), 2048)
    elif chunk > 0:
        tokens = max(chunk, 2048)
    else:
        tokens = max(values["max_prefill_tokens"] or DEFAULT_MAX_PREFILL_TOKENS, 2048)
    reserve = 512 + tokens * 1.5 + tp_pp + _graph_reserve(values, mla, graphs, decode_bs)
    if gpu_mib > LARGE_GPU_MIB:
        reserve = max(reserve, MIN_RESERVE_MIB)
    deepep = values["moe_a2a_backend"] == "deepep"
    if mode != "prefill" and graphs.decode_backend != DISABLED and deepep:
        reserve += DEEPEP_MIB
    return reserve


def _graph_reserve(
    values: Mapping[str, Any], mla: bool, graphs: GraphConfig, decode_bs: int
) -> float:
    """``reserve_for_graph_mb``: decode and prefill CUDA graphs, DP attention's padding."""
    mode, attn_dp = values["disaggregation_mode"], values["attn_dp_size"]
    reserve = 0.0
    if mode != "prefill" and graphs.decode_backend != DISABLED:
        reserve += decode_bs * 2
    if attn_dp > 1 and mode != "prefill":
        reserve += decode_bs * attn_dp * 3
        if decode_bs > 300:
            reserve += decode_bs * attn_dp * 1.5
    if mode != "decode" and graphs.prefill_backend != DISABLED:
        reserve += MLA_PREFILL_GRAPH_MIB if mla else len(_prefill_bs(values, graphs, mla)) * 8
        if graphs.prefill_backend == BREAKABLE and values["moe_a2a_backend"] == "deepep":
            reserve += BREAKABLE_DEEPEP_MIB
    return reserve


def _prefill_bs(values: Mapping[str, Any], graphs: GraphConfig, mla: bool) -> list[int]:
    if graphs.prefill_bs is not None:
        return list(graphs.prefill_bs)
    max_bs = graphs.prefill_max_bs
    if max_bs is None:
        chunk = values["chunked_prefill_size"]
        max_bs = min(8192, chunk) if mla else chunk
        if values["max_total_tokens"] is not None:
            max_bs = min(max_bs, values["max_total_tokens"])
    return prefill_graph_sizes(max_bs)


def _post_capture_sizing(
    values: Mapping[str, Any], env: Mapping[str, str], mla: bool, graphs: GraphConfig
) -> bool:
    """``post_capture_kv_sizing_planned``: a non-MLA model sized after graph capture."""
    if values["enable_kv_cache_sharding"] or mla:
        return False
    if not env_bool(env, "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"):
        return False
    if values["dcp_size"] != 1 or values["prefill_only_disable_kv_cache"]:
        return False
    if values["enable_memory_saver"] or env.get("SGLANG_MOONCAKE_CUSTOM_MEM_POOL"):
        return False
    mode = values["disaggregation_mode"]
    if mode != "prefill" and graphs.decode_backend == DISABLED:
        return False
    if mode != "decode":
        chunk, sizes = values["chunked_prefill_size"], _prefill_bs(values, graphs, mla)
        if graphs.prefill_backend == DISABLED or chunk <= 0 or chunk > max(sizes or [0]):
            return False
    return True


def planned_memory(
    gpu_mib: float,
    tp_size: int,
    attn_dp_size: int = 1,
    chunked_prefill_size: int | None = None,
    cuda_graph_max_bs: int | None = None,
) -> MemoryDefaults:
    """SGLang's memory defaults for a layout alone: every other option at SGLang's default
    (no PD, no PP, an MLA model)."""
    from flags.sglang.parser import sglang_defaults

    values = sglang_defaults() | {
        "tp_size": tp_size,
        "attn_dp_size": attn_dp_size,
        "chunked_prefill_size": chunked_prefill_size,
        "cuda_graph_max_bs_decode": cuda_graph_max_bs,
    }
    return memory_defaults(values, {}, mla=True, gpu_mib=gpu_mib)
