"""SGLang 0.5.23's resolution of CP, attention DP, page size and PD: :func:`resolve_sglang`.

The steps run in the order of SGLang's pipeline (``sglang/srt/arg_groups/pipeline.py``), as
it runs on one CUDA Hopper node (H100/H200, sm90): the platform decides the DSA page size,
KV dtype and kernels. Each step names the file it follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flags.checks import Problem, ProblemCode
from flags.sglang.encoder import check_encoder_disaggregation
from flags.sglang.experts import eplb_and_dispatch, lm_head
from flags.sglang.kv_shard import check_kv_cache_sharding
from flags.sglang.memory import H200_MIB, MemoryDefaults, memory_defaults
from flags.sglang.model_config import check_model_config
from flags.sglang.model_rules import attention_backend, model_rules
from flags.sglang.models import SglangModel
from flags.sglang.parser import ParsedArgs
from flags.sglang.rules import (
    MEMORY_HOOK,
    MODEL_HOOK,
    OVERRIDES,
    PARALLEL_HOOK,
    PD_HOOK,
    Resolving,
)

A2A_EP_BACKENDS = frozenset(
    {"megamoe", "deepep", "deepep_v2", "mooncake", "nixl", "ascend_fuseep", "flashinfer"}
)
"""MoE all-to-all backends that span the TP group: EP becomes the TP size
(``overrides.py: _a2a_ep_size``)."""


@dataclass(frozen=True, slots=True)
class SglangResolution:
    """What SGLang 0.5.23 makes of a launch command at start-up."""

    values: dict[str, Any]
    """Every ``ServerArgs`` field with an option, as resolved."""
    parsed_values: dict[str, Any]
    """The same fields as the command gives them (defaults filled in), before the rules."""
    given: dict[str, str]
    """The fields the command sets, to the option that set each."""
    declared: dict[str, str]
    """The fields a rule resolved, to the rule's file in the wheel."""
    problems: tuple[Problem, ...]
    """Every rule the command breaks (SGLang stops at the first)."""
    notes: tuple[str, ...]
    model: SglangModel | None
    read: frozenset[str]
    """The fields SGLang's rules, as cpkv models them, read."""
    env: dict[str, str] = field(default_factory=dict)
    """The environment assignments the rules read."""
    memory: MemoryDefaults | None = None
    """What the GPU-memory rule resolved (before the model overrides: chunk, decode graph
    size, derived fraction); None when the model is unknown. ``values`` holds the fraction
    after KV sharding's correction."""

    @property
    def cp_size(self) -> int:
        """The prefill CP size: the attention CP size while prefill CP is on, else 1."""
        return int(self.values["attn_cp_size"]) if self.values["enable_prefill_cp"] else 1

    @property
    def attn_tp_size(self) -> int:
        """Ranks that split one copy of the attention weights: ``tp / (attn_dp x attn_cp)``,
        whether or not prefill CP is on (SGLang carves the attention-CP group out of TP)."""
        values = self.values
        return int(values["tp_size"] // max(values["attn_dp_size"] * values["attn_cp_size"], 1))


def resolve_sglang(
    parsed: ParsedArgs,
    env: dict[str, str],
    model: SglangModel | None,
    gpu_mib: float = H200_MIB,
) -> SglangResolution:
    """SGLang's resolution of ``parsed`` for ``model`` (None: a model cpkv does not know,
    whose model rules are skipped) on a GPU of ``gpu_mib`` MiB (an H200 by default)."""
    state = Resolving(parsed, env, model, gpu_mib)
    for step in (
        _device,
        check_model_config,
        _deprecated_dp_attention,
        _pd_disaggregation,
        _decode_context_parallelism,
        _gpu_memory,
        model_rules,
        attention_backend,
        _page_size_default,
        _data_parallelism,
        _context_parallelism,
        check_kv_cache_sharding,
        _a2a_ep_size,
        eplb_and_dispatch,
        _cache_compatibility,
        lm_head,
        check_encoder_disaggregation,
        _model_capability,
    ):
        step(state)
    return SglangResolution(
        state.values,
        dict(parsed.values),
        state.given,
        state.declared,
        tuple(state.problems),
        tuple(state.notes),
        model,
        frozenset(state.read),
        dict(env),
        state.memory,
    )


def _device(state: Resolving) -> None:
    """``--device`` unset is the machine's accelerator: CUDA here."""
    if state["device"] is None:
        state.values["device"] = "cuda"
    elif state["device"] != "cuda":
        state.notes.append(
            f"--device {state['device']}: cpkv applies SGLang's CUDA rules only; the "
            f"{state['device']} branches of its model rules are not modelled"
        )


def _deprecated_dp_attention(state: Resolving) -> None:
    """``--dp-size N --enable-dp-attention`` is ``--attn-dp-size N`` (parallel_hook.py)."""
    if state["enable_dp_attention"] and state["attn_dp_size"] == 1:
        state.declare(PARALLEL_HOOK, attn_dp_size=state["dp_size"], dp_size=1)


def _pd_disaggregation(state: Resolving) -> None:
    """mooncake_tcp is Mooncake over TCP; the backend must serve the role
    (pd_disaggregation_hook.py)."""
    backend = state["disaggregation_transfer_backend"]
    if backend == "mooncake_tcp":
        state.declare(PD_HOOK, disaggregation_transfer_backend="mooncake")
        state.notes.append("mooncake_tcp is Mooncake with its TCP transport (MC_FORCE_TCP=1)")
        backend = "mooncake"
    mode = state["disaggregation_mode"]
    if mode == "prefill" and backend == "fake":
        state.refuse("pd_prefill_fake", disaggregation_transfer_backend=backend)
    if mode == "decode":
        # NOTE: a decode worker runs without the radix cache unless asked to keep it.
        keep = bool(state["disaggregation_decode_enable_radix_cache"])
        state.declare(PD_HOOK, disable_radix_cache=not keep)
    staging = state.env_on("SGLANG_DISAGG_STAGING_BUFFER")
    if mode != "null" and staging and backend not in ("mooncake", "nixl"):
        state.refuse("pd_staging_backend", disaggregation_transfer_backend=backend)


def _decode_context_parallelism(state: Resolving) -> None:
    """parallel_hook.py: handle_decode_context_parallelism, after overrides.py's
    ``_dcp_comm_backend_default`` (``a2a`` for DCP on Hopper, else ``ag_rs``)."""
    dcp = state["dcp_size"]
    if state["dcp_comm_backend"] is None:
        state.declare(OVERRIDES, dcp_comm_backend="a2a" if dcp > 1 else "ag_rs")
    comm = state["dcp_comm_backend"]
    if dcp < 1:
        state.refuse("dcp_below_one", dcp_size=dcp)
    if dcp > 1 and state["enable_prefill_cp"]:
        state.refuse("dcp_with_prefill_cp", dcp_size=dcp)
    if comm in ("a2a", "fi_a2a") and dcp <= 1:
        state.refuse("dcp_comm_without_dcp", dcp_comm_backend=comm, dcp_size=dcp)
    if state["dcp_replicate_q_proj"]:
        if dcp <= 1:
            state.refuse("dcp_replicate_q_without_dcp", dcp_replicate_q_proj=True, dcp_size=dcp)
        elif comm not in ("a2a", "fi_a2a"):
            state.refuse("dcp_replicate_q_comm", dcp_replicate_q_proj=True, dcp_comm_backend=comm)


def _gpu_memory(state: Resolving) -> None:
    """memory_hook.py: handle_gpu_memory_settings, on the H200 (before the model overrides:
    it reads the command's own sizes and MoE backend)."""
    if state.model is None:
        return
    model = state.model
    defaults = memory_defaults(state.values, state.env, model.mla, state.gpu_mib, model.multimodal)
    state.memory = defaults
    if state["chunked_prefill_size"] is None:
        state.declare(MEMORY_HOOK, chunked_prefill_size=defaults.chunked_prefill_size)
    if defaults.mem_fraction_static is not None:
        state.declare(MEMORY_HOOK, mem_fraction_static=defaults.mem_fraction_static)
    state.read |= {"mem_fraction_static", "max_running_requests", "pp_size", "dcp_size"}
    state.read |= {dest for dest in state.values if "cuda_graph" in dest}


def _data_parallelism(state: Resolving) -> None:
    """parallel_hook.py: handle_data_parallelism."""
    attn_dp, dp, tp = state["attn_dp_size"], state["dp_size"], state["tp_size"]
    if attn_dp < 1:
        state.refuse("attn_dp_below_one", attn_dp_size=attn_dp)
    elif attn_dp > 1 and dp > 1 and not state.refused(ProblemCode.SGLANG_ATTN_DP):
        state.refuse("attn_dp_with_replicas", attn_dp_size=attn_dp, dp_size=dp)
    elif attn_dp > 1 and tp % attn_dp:
        state.refuse("attn_dp_indivisible", tp_size=tp, attn_dp_size=attn_dp)
    chunk = state["chunked_prefill_size"]
    if attn_dp > 1 and chunk is not None:
        state.declare(PARALLEL_HOOK, chunked_prefill_size=chunk // attn_dp)


def _context_parallelism(state: Resolving) -> None:
    """parallel_hook.py: handle_context_parallelism."""
    prefill_cp, strategy = state["enable_prefill_cp"], state["cp_strategy"]
    dsv32 = state.model is not None and state.model.architecture == "DeepseekV32ForCausalLM"
    if prefill_cp and dsv32 and strategy == "zigzag":
        state.refuse("cp_zigzag_dsv32", cp_strategy=strategy)
    if prefill_cp and strategy is None:
        state.refuse("cp_strategy_unset", enable_prefill_cp=True)
    tp, cp, attn_dp = state["tp_size"], state["attn_cp_size"], state["attn_dp_size"]
    if cp > 1 and attn_dp >= 1 and (tp % cp or tp % (attn_dp * cp)):
        state.refuse("cp_indivisible", tp_size=tp, attn_dp_size=attn_dp, attn_cp_size=cp)
    _moe_dp(state)


def _moe_dp(state: Resolving) -> None:
    tp, ep, cp, moe_dp = (state[k] for k in ("tp_size", "ep_size", "attn_cp_size", "moe_dp_size"))
    broken = cp != moe_dp and moe_dp != 1
    if moe_dp > 1:
        broken |= bool(tp % moe_dp) or ep * moe_dp > tp or state["pp_size"] != 1
        broken |= ep > 1 and ep * moe_dp != tp
    if broken:
        state.refuse("moe_dp", moe_dp_size=moe_dp, tp_size=tp, ep_size=ep, attn_cp_size=cp)


def _page_size_default(state: Resolving) -> None:
    """No ``--page-size`` and no model rule: one token a page on CUDA (overrides.py)."""
    if state["page_size"] is None:
        state.declare(OVERRIDES, page_size=1)


def _model_capability(state: Resolving) -> None:
    """model_hook.py: handle_model_capability_adjustments, late in the pipeline: a VLM
    that cannot chunk its prefill runs without chunked prefill."""
    vlm = state.model.multimodal if state.model is not None else None
    if vlm is not None and not vlm.chunked_prefill and vlm.is_multimodal(state.values):
        state.declare(MODEL_HOOK, chunked_prefill_size=-1)


def _cache_compatibility(state: Resolving) -> None:
    """kv_cache_hook.py: handle_cache_compatibility (HiCache needs the radix cache)."""
    if state["enable_hierarchical_cache"] and state["disable_radix_cache"]:
        state.refuse("hicache_without_radix", enable_hierarchical_cache=True)


def _a2a_ep_size(state: Resolving) -> None:
    """A TP-spanning MoE all-to-all backend makes EP the TP size (overrides.py)."""
    if state["moe_a2a_backend"] in A2A_EP_BACKENDS and state["ep_size"] != state["tp_size"]:
        state.declare(OVERRIDES, ep_size=state["tp_size"])
