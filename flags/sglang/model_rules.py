"""SGLang 0.5.23's model rules and attention-backend rules: :func:`model_rules`,
:func:`attention_backend`.

A model's ``config.json`` decides its CP layout, page size, KV dtype and kernels
(``sglang/srt/arg_groups/model_overrides/deepseek_v2.py``, ``model_hook.py``,
``overrides.py``), as SGLang resolves them on one CUDA Hopper node; the attention backend
decides the page size its kernels need (``attention_hook.py``).
"""

from __future__ import annotations

from flags.checks import ProblemCode
from flags.sglang.models import HYV4, MODEL_HOOK_FAMILY, SglangModel
from flags.sglang.rules import (
    DEEPSEEK_OVERRIDES,
    OVERRIDE_BASE,
    OVERRIDES,
    Resolving,
    SglangRule,
)

DSA_PAGE = 64
"""Tokens per page of a DSA model on CUDA, times its ``index_kpool``."""
SINK_BACKEND = "flashmla_sparse"
"""The one DSA kernel that runs learnable attention sinks."""

C = ProblemCode
SINK_BACKEND_RULE = SglangRule(
    C.SGLANG_DSA_BACKEND,
    OVERRIDES,
    "This model uses learnable attention sinks and requires the flashmla_sparse DSA backends.",
    "leave --dsa-prefill-backend and --dsa-decode-backend unset",
)
TILELANG_HISPARSE = SglangRule(
    C.SGLANG_DSA_BACKEND,
    OVERRIDES,
    "CUDA TileLang FP8 KV does not support HiSparse.",
    "pick flashmla_kv, or drop --enable-hisparse",
)
TILELANG_DCP = SglangRule(
    C.SGLANG_DSA_BACKEND,
    OVERRIDES,
    "CUDA TileLang FP8 KV does not support --dcp-size > 1.",
    "pick flashmla_kv, or drop --dcp-size",
)
SINK_KV_DTYPE = SglangRule(
    C.SGLANG_DSA_KV_CACHE_DTYPE,
    OVERRIDES,
    "Learnable DSA attention sinks require a bfloat16 KV cache.",
    "use --kv-cache-dtype bfloat16",
)
MODEL_RULES = (SINK_BACKEND_RULE, SINK_KV_DTYPE, TILELANG_HISPARSE, TILELANG_DCP)
"""The model rules kept here rather than in :data:`flags.sglang.rules.RULES`."""


def model_rules(state: Resolving) -> None:
    model = state.model
    if model is None:
        path = state["model_path"]
        state.notes.append(
            f"model {path!r} is not one cpkv knows (DeepSeek-V3.2, GLM-5, DeepSeek-V3/R1, "
            "Kimi-K2, or a folder on this machine with a config.json): "
            "SGLang's model rules (CP size, page size, KV dtype) are not applied; name the "
            "model with --model PRESET"
        )
        return
    if state["enable_dsa_cache_layer_split"] and not model.dsa:
        state.refuse("dsa_layer_split_not_dsa", enable_dsa_cache_layer_split=True)
    if not model.deepseek_family:
        return
    if model.architecture in HYV4:
        _hyv4(state)
    if model.dsa:
        _dsa_rules(state, model)
    elif model.mla and state["enable_prefill_cp"]:
        _mla_cp(state)


def _dsa_rules(state: Resolving, model: SglangModel) -> None:
    """DeepSeek-V3.2 and GLM-5 (model_overrides/deepseek_v2.py, model_hook.py, overrides.py);
    ``model_hook.py``'s own checks list one architecture fewer (:data:`MODEL_HOOK_FAMILY`)."""
    _dsa_dcp(state, model)
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
    if model.architecture in MODEL_HOOK_FAMILY:
        if state["enable_prefill_cp"] and state["disaggregation_mode"] == "decode":
            state.refuse("cp_on_decode", disaggregation_mode="decode")
        _dsa_layer_split(state)
    _dsa_kv_cache_dtype(state, model)
    _dsa_backends(state, model)


def _hyv4(state: Resolving) -> None:
    """HYV4's attention has neither prefill CP nor DCP (deepseek_v2.py)."""
    if state["enable_prefill_cp"]:
        state.refuse("hyv4_prefill_cp", enable_prefill_cp=True)
    if state["dcp_size"] > 1:
        state.refuse("hyv4_dcp", dcp_size=state["dcp_size"])


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


def _dsa_kv_cache_dtype(state: Resolving, model: SglangModel) -> None:
    """``auto`` is bfloat16 below Blackwell; only bf16 and fp8_e4m3, and bfloat16 alone for a
    model with learnable sinks (overrides.py)."""
    dtype = state["kv_cache_dtype"]
    if model.learnable_sink and dtype not in ("auto", "bf16", "bfloat16"):
        state.add(SINK_KV_DTYPE.problem(kv_cache_dtype=dtype))
    resolved = "bfloat16" if dtype in ("auto", "bf16") else dtype
    if resolved not in ("bfloat16", "fp8_e4m3"):
        state.refuse("dsa_kv_dtype", kv_cache_dtype=dtype)
    elif resolved != dtype:
        state.declare(OVERRIDES, kv_cache_dtype=resolved)


def _dsa_backends(state: Resolving, model: SglangModel) -> None:
    """Hopper's DSA kernels: flashmla_sparse for a model with learnable sinks, HiSparse's
    own, flashmla_kv for fp8 KV, else flashmla_sparse / fa3 (overrides.py:
    ``_dsa_split_backend_resolution``)."""
    fp8 = state["kv_cache_dtype"] == "fp8_e4m3"
    if model.learnable_sink:
        _sink_backends(state)
        return
    if state["enable_hisparse"]:
        sparse = "flashmla_kv" if fp8 else "flashmla_sparse"
        defaults = (sparse, sparse)
    else:
        defaults = ("flashmla_kv", "flashmla_kv") if fp8 else ("flashmla_sparse", "fa3")
    for dest, default in zip(("dsa_prefill_backend", "dsa_decode_backend"), defaults, strict=True):
        if state[dest] is None:
            state.declare(OVERRIDES, **{dest: default})
    prefill, decode = state["dsa_prefill_backend"], state["dsa_decode_backend"]
    if state["enable_hisparse"] and fp8 and "tilelang" in (prefill, decode):
        state.add(TILELANG_HISPARSE.problem(enable_hisparse=True, kv_cache_dtype="fp8_e4m3"))
        return
    if "triton" in (prefill, decode):
        state.refuse(
            "dsa_backend_rocm_only", dsa_prefill_backend=prefill, dsa_decode_backend=decode
        )
    if not fp8 or "tilelang" not in (prefill, decode):
        return
    if prefill != decode:
        state.refuse(
            "dsa_backend_tilelang_fp8", dsa_prefill_backend=prefill, dsa_decode_backend=decode
        )
    elif state["dcp_size"] > 1:
        state.add(TILELANG_DCP.problem(dsa_prefill_backend=prefill, dcp_size=state["dcp_size"]))


def _sink_backends(state: Resolving) -> None:
    """Learnable attention sinks run on flashmla_sparse only, given or not."""
    for dest in ("dsa_prefill_backend", "dsa_decode_backend"):
        given = state[dest]
        if given is None:
            state.declare(OVERRIDES, **{dest: SINK_BACKEND})
        elif given != SINK_BACKEND:
            state.add(SINK_BACKEND_RULE.problem(**{dest: given}))


def _dsa_dcp(state: Resolving, model: SglangModel) -> None:
    """DSA under DCP: no HiCache or PD, EAGLE top-k 1, both DSA kernels ``trtllm`` unless
    given, and Q projection replicated on the a2a backends (deepseek_v2.py:
    ``_dsa_dcp_overrides``); a pooled index key cannot span DCP ranks."""
    if state["dcp_size"] <= 1:
        return
    if state["enable_hisparse"] or state["enable_hierarchical_cache"]:
        state.refuse("dsa_dcp_hicache", dcp_size=state["dcp_size"])
    if state["disaggregation_mode"] != "null":
        state.refuse("dsa_dcp_pd", disaggregation_mode=state["disaggregation_mode"])
    if state["speculative_eagle_topk"] not in (None, 1):
        state.refuse("dsa_dcp_eagle_topk", speculative_eagle_topk=state["speculative_eagle_topk"])
    for dest in ("dsa_prefill_backend", "dsa_decode_backend"):
        if state[dest] is None:
            state.declare(DEEPSEEK_OVERRIDES, **{dest: "trtllm"})
    if state["dcp_replicate_q_proj"] is None and state["dcp_comm_backend"] in ("a2a", "fi_a2a"):
        state.declare(DEEPSEEK_OVERRIDES, dcp_replicate_q_proj=True)
    if model.index_kpool > 1:
        state.refuse("dsa_dcp_index_kpool", dcp_size=state["dcp_size"])


def attention_backend(state: Resolving) -> None:
    """attention_hook.py: the attention backend's default (``fa3`` on Hopper, for MLA and
    MHA alike) and the page sizes MLA and TRT-LLM kernels need (overrides.py:
    ``_mla_backend_page_constraints``); TRT-LLM MLA and CuteDSL MLA need Blackwell."""
    prefill, decode = state["prefill_attention_backend"], state["decode_attention_backend"]
    if prefill is not None and prefill == decode:
        state.declare(OVERRIDES, attention_backend=prefill)
    elif state["attention_backend"] is None and state.model is not None:
        state.declare(OVERRIDES, attention_backend="fa3")
    if state["attention_backend"] == "fa3" and state["kv_cache_dtype"] == "fp8_e5m2":
        # NOTE: FlashAttention 3 stores FP8 as e4m3 only (_attention_backend_fa3_fp8_fallback).
        state.declare(OVERRIDES, attention_backend="triton")
    backends = {state["attention_backend"], prefill, decode}
    page = state["page_size"]
    if {state["attention_backend"], decode} & {"flashmla"}:
        page = 64
    for backend, allowed in _BACKEND_PAGES:
        if backend in backends and page not in allowed:
            page = 64
    if page != state["page_size"]:
        state.declare(OVERRIDES, page_size=page)
    if {state["attention_backend"], decode} & {"trtllm_mla"}:
        state.refuse("trtllm_mla_blackwell", attention_backend="trtllm_mla")
    if "cutedsl_mla" in backends:
        state.refuse("cutedsl_mla_blackwell", attention_backend="cutedsl_mla")


_BACKEND_PAGES = (
    ("trtllm_mla", (32, 64)),
    ("cutedsl_mla", (32, 64)),
    ("trtllm_mha", (16, 32, 64, 128)),
    ("hpc_ops", (64,)),
)
"""Attention backends that snap the page size to 64 unless it is one they take."""
