"""SGLang 0.5.23's resolution of CP, attention DP, page size and PD: :func:`resolve_sglang`.

The steps run in the order of SGLang's pipeline (``sglang/srt/arg_groups/pipeline.py``), as
it runs on one CUDA Hopper node (H100/H200, sm90): the platform decides the DSA page size,
KV dtype and kernels. Each step names the file it follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flags.checks import Problem, ProblemCode
from flags.sglang.kv_shard import check_kv_cache_sharding
from flags.sglang.models import SglangModel
from flags.sglang.parser import ParsedArgs
from flags.sglang.rules import (
    DEEPSEEK_OVERRIDES,
    OVERRIDE_BASE,
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
DSA_PAGE = 64
"""Tokens per page of a DSA model on CUDA, times its ``index_kpool``."""


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

    @property
    def cp_size(self) -> int:
        """The prefill CP size: the attention CP size while prefill CP is on, else 1."""
        return int(self.values["attn_cp_size"]) if self.values["enable_prefill_cp"] else 1


def resolve_sglang(
    parsed: ParsedArgs, env: dict[str, str], model: SglangModel | None
) -> SglangResolution:
    """SGLang's resolution of ``parsed`` for ``model`` (None: a model cpkv does not know,
    whose model rules are skipped)."""
    state = Resolving(parsed, env, model)
    for step in (
        _device,
        _deprecated_dp_attention,
        _pd_disaggregation,
        _decode_context_parallelism,
        _model_rules,
        _data_parallelism,
        _context_parallelism,
        _page_size_default,
        check_kv_cache_sharding,
        _a2a_ep_size,
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
    staging = state.env_on("SGLANG_DISAGG_STAGING_BUFFER")
    if mode != "null" and staging and backend not in ("mooncake", "nixl"):
        state.refuse("pd_staging_backend", disaggregation_transfer_backend=backend)


def _decode_context_parallelism(state: Resolving) -> None:
    """parallel_hook.py: handle_decode_context_parallelism."""
    if state["dcp_size"] < 1:
        state.refuse("dcp_below_one", dcp_size=state["dcp_size"])
    if state["dcp_size"] > 1 and state["enable_prefill_cp"]:
        state.refuse("dcp_with_prefill_cp", dcp_size=state["dcp_size"])


def _model_rules(state: Resolving) -> None:
    model = state.model
    if model is None:
        path = state["model_path"]
        state.notes.append(
            f"model {path!r} is not one cpkv knows (DeepSeek-V3.2, GLM-5, DeepSeek-V3/R1): "
            "SGLang's model rules (CP size, page size, KV dtype) are not applied; name the "
            "model with --model PRESET"
        )
        return
    if model.dsa:
        _dsa_rules(state, model)
    elif model.mla and state["enable_prefill_cp"]:
        _mla_cp(state)


def _dsa_rules(state: Resolving, model: SglangModel) -> None:
    """DeepSeek-V3.2 and GLM-5 (model_overrides/deepseek_v2.py, model_hook.py, overrides.py)."""
    if all(
        state[b] is None
        for b in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
    ):
        state.declare(DEEPSEEK_OVERRIDES, attention_backend="dsa")
    if state["device"] != "cuda":
        return
    if state["enable_prefill_cp"]:
        _dsa_cp(state)
    state.declare(DEEPSEEK_OVERRIDES, page_size=DSA_PAGE * model.index_kpool)
    if state["enable_prefill_cp"] and state["disaggregation_mode"] == "decode":
        state.refuse("cp_on_decode", disaggregation_mode="decode")
    _dsa_layer_split(state)
    _dsa_kv_cache_dtype(state)
    _dsa_backends(state)


def _dsa_cp(state: Resolving) -> None:
    """DSA prefill CP: attention DP from ``--dp-size`` too, zigzag on DeepEP with EP = TP,
    one machine, and CP = TP / attention DP unless interleave names its own."""
    attn_dp = _cp_attn_dp(state)
    tp = state["tp_size"]
    if state["cp_strategy"] == "zigzag":
        state.declare(DEEPSEEK_OVERRIDES, moe_dense_tp_size=1, moe_a2a_backend="deepep", ep_size=tp)
    if tp > 8:
        state.refuse("cp_tp_above_8", tp_size=tp)
    keep = state["cp_strategy"] == "interleave" and state["attn_cp_size"] > 1
    if not keep and attn_dp >= 1:
        state.declare(DEEPSEEK_OVERRIDES, attn_cp_size=tp // attn_dp)


def _mla_cp(state: Resolving) -> None:
    """MLA prefill CP (DeepSeek-V3/R1): attention TP 1 on DeepEP (deepseek_v2.py)."""
    attn_dp = _cp_attn_dp(state)
    tp = state["tp_size"]
    state.declare(DEEPSEEK_OVERRIDES, moe_dense_tp_size=1, moe_a2a_backend="deepep", ep_size=tp)
    if attn_dp >= 1:
        state.declare(DEEPSEEK_OVERRIDES, attn_cp_size=tp // attn_dp)


def _cp_attn_dp(state: Resolving) -> int:
    """CP layouts run ``--dp-size`` groups as attention DP (model_override_base.py)."""
    attn_dp, dp = state["attn_dp_size"], state["dp_size"]
    if attn_dp > 1 and dp > 1:
        state.refuse("cp_attn_dp_with_replicas", attn_dp_size=attn_dp, dp_size=dp)
    if dp > 1:
        state.notes.append(
            f"--dp-size {dp} under prefill CP runs {dp} attention-DP groups; SGLang deprecates "
            f"this reading: use --attn-dp-size {dp} ({OVERRIDE_BASE})"
        )
    state.declare(DEEPSEEK_OVERRIDES, attn_dp_size=attn_dp * dp, dp_size=1)
    return int(attn_dp * dp)


def _dsa_layer_split(state: Resolving) -> None:
    """``--enable-dsa-cache-layer-split`` (model_hook.py)."""
    if not state["enable_dsa_cache_layer_split"]:
        return
    interleave = state["enable_prefill_cp"] and state["cp_strategy"] == "interleave"
    mode, backend = state["disaggregation_mode"], state["disaggregation_transfer_backend"]
    if mode != "prefill" or not interleave or backend != "mooncake" or state["pp_size"] > 1:
        state.refuse(
            "dsa_layer_split",
            disaggregation_mode=mode,
            cp_strategy=state["cp_strategy"],
            disaggregation_transfer_backend=backend,
            pp_size=state["pp_size"],
        )


def _dsa_kv_cache_dtype(state: Resolving) -> None:
    """``auto`` is bfloat16 below Blackwell; only bf16 and fp8_e4m3 (overrides.py)."""
    dtype = state["kv_cache_dtype"]
    resolved = "bfloat16" if dtype in ("auto", "bf16") else dtype
    if resolved not in ("bfloat16", "fp8_e4m3"):
        state.refuse("dsa_kv_dtype", kv_cache_dtype=dtype)
    elif resolved != dtype:
        state.declare(OVERRIDES, kv_cache_dtype=resolved)


def _dsa_backends(state: Resolving) -> None:
    """Hopper's DSA kernels: flashmla_kv for fp8 KV, else flashmla_sparse / fa3
    (overrides.py: _dsa_split_backend_resolution)."""
    fp8 = state["kv_cache_dtype"] == "fp8_e4m3"
    defaults = ("flashmla_kv", "flashmla_kv") if fp8 else ("flashmla_sparse", "fa3")
    for dest, default in zip(("dsa_prefill_backend", "dsa_decode_backend"), defaults, strict=True):
        if state[dest] is None:
            state.declare(OVERRIDES, **{dest: default})
    prefill, decode = state["dsa_prefill_backend"], state["dsa_decode_backend"]
    if "triton" in (prefill, decode):
        state.refuse(
            "dsa_backend_rocm_only", dsa_prefill_backend=prefill, dsa_decode_backend=decode
        )
    if fp8 and "tilelang" in (prefill, decode) and prefill != decode:
        state.refuse(
            "dsa_backend_tilelang_fp8", dsa_prefill_backend=prefill, dsa_decode_backend=decode
        )


def _data_parallelism(state: Resolving) -> None:
    """parallel_hook.py: handle_data_parallelism."""
    attn_dp, dp, tp = state["attn_dp_size"], state["dp_size"], state["tp_size"]
    if attn_dp < 1:
        state.refuse("attn_dp_below_one", attn_dp_size=attn_dp)
    elif attn_dp > 1 and dp > 1 and not state.refused(ProblemCode.SGLANG_ATTN_DP):
        state.refuse("attn_dp_with_replicas", attn_dp_size=attn_dp, dp_size=dp)
    elif attn_dp > 1 and tp % attn_dp:
        state.refuse("attn_dp_indivisible", tp_size=tp, attn_dp_size=attn_dp)


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


def _a2a_ep_size(state: Resolving) -> None:
    """A TP-spanning MoE all-to-all backend makes EP the TP size (overrides.py)."""
    if state["moe_a2a_backend"] in A2A_EP_BACKENDS and state["ep_size"] != state["tp_size"]:
        state.declare(OVERRIDES, ep_size=state["tp_size"])
