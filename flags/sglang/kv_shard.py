"""SGLang 0.5.23's requirements of ``--enable-kv-cache-sharding``: :func:`check_kv_cache_sharding`.

Every check of ``sglang/srt/arg_groups/kv_shard_hook.py`` (``handle_kv_cache_sharding`` and
``validate_kv_shard_attention_backend``), in its order; SGLang stops at the first, cpkv
reports them all. The chunk-size rounding it declares is resolved here too.
"""

from __future__ import annotations

from flags.checks import ProblemCode, Value
from flags.sglang.rules import KV_SHARD_HOOK, Resolving, SglangRule

C = ProblemCode
PD_PREFILL_ONLY = SglangRule(
    C.SGLANG_KV_SHARDING_PD_PREFILL_ONLY,
    KV_SHARD_HOOK,
    "--enable-kv-cache-sharding is only supported on PD prefill workers: a rank's pool holds "
    "only its stripe of every cached page, which is incompatible with local decode.",
    "add --disaggregation-mode prefill, or drop --enable-kv-cache-sharding",
)
DSA_CP = SglangRule(
    C.SGLANG_KV_SHARDING_DSA_CP,
    KV_SHARD_HOOK,
    "DSA KV sharding requires CUDA interleave prefill CP > 1 and PP1.",
    "add --enable-prefill-cp --cp-strategy interleave on CUDA with --pp-size 1",
)
DSA_KERNELS = SglangRule(
    C.SGLANG_KV_SHARDING_DSA_KERNELS,
    KV_SHARD_HOOK,
    "DSA KV sharding requires TRTLLM prefill/decode with fp8_e4m3 KV and page size 64.",
    "add --dsa-prefill-backend trtllm --dsa-decode-backend trtllm --kv-cache-dtype fp8_e4m3",
)
DSA_TRANSFER = SglangRule(
    C.SGLANG_KV_SHARDING_DSA_TRANSFER,
    KV_SHARD_HOOK,
    "DSA KV sharding requires Mooncake, uncompressed index_kpool=1 and no DSA cache layer "
    "splitting.",
    "use --disaggregation-transfer-backend mooncake and drop --enable-dsa-cache-layer-split",
)
ATTENTION_BACKEND = SglangRule(
    C.SGLANG_KV_SHARDING_ATTENTION_BACKEND,
    KV_SHARD_HOOK,
    "KV sharding requires the dsa attention backend for DSA models, else fa3, or trtllm_mla "
    "for plain-TP MLA with chunked prefix caching.",
    "leave --attention-backend unset for a DSA model",
)
TRANSFER_BACKEND = SglangRule(
    C.SGLANG_KV_SHARDING_TRANSFER_BACKEND,
    KV_SHARD_HOOK,
    "--enable-kv-cache-sharding currently only supports the mooncake and nixl transfer backends.",
    "use --disaggregation-transfer-backend mooncake",
)
LAYOUT = SglangRule(
    C.SGLANG_KV_SHARDING_LAYOUT,
    KV_SHARD_HOOK,
    "KV sharding needs a group to shard over (MLA: plain TP > 1 or prefill CP; GQA: prefill "
    "CP > 1), a real page size (> 1) and chunked prefill (--chunked-prefill-size > 0).",
    "shard over prefill CP or TP, with --page-size 64 and chunked prefill",
)
FEATURE = SglangRule(
    C.SGLANG_KV_SHARDING_FEATURE,
    KV_SHARD_HOOK,
    "--enable-kv-cache-sharding does not support this feature.",
    "drop the feature, or --enable-kv-cache-sharding",
)

KV_RULES = (
    PD_PREFILL_ONLY,
    DSA_CP,
    DSA_KERNELS,
    DSA_TRANSFER,
    ATTENTION_BACKEND,
    TRANSFER_BACKEND,
    LAYOUT,
    FEATURE,
)
"""Every rule of KV sharding."""

_UNSUPPORTED = (
    "dllm_algorithm",
    "radix_cache_backend",
)
"""Options that must stay unset under KV sharding."""
_UNSUPPORTED_SWITCHES = (
    "enable_unified_cache_external_linker",
    "enable_streaming_session",
    "enable_session_radix_cache",
    "enable_flexkv",
    "enable_unified_memory",
    "enable_lmcache",
    "enable_hisparse",
    "enable_two_batch_overlap",
)
"""Switches that must stay off under KV sharding."""


def check_kv_cache_sharding(state: Resolving) -> None:
    """Every requirement of KV sharding the command breaks, as problems."""
    if not state["enable_kv_cache_sharding"]:
        return
    if state["disaggregation_mode"] != "prefill":
        state.add(PD_PREFILL_ONLY.problem(disaggregation_mode=state["disaggregation_mode"]))
    _features(state)
    _attention_backend(state)
    backend = state["disaggregation_transfer_backend"]
    if backend not in ("mooncake", "nixl"):
        state.add(TRANSFER_BACKEND.problem(disaggregation_transfer_backend=backend))
    if state.env_on("SGLANG_DISAGG_STAGING_BUFFER"):
        _feature(state, SGLANG_DISAGG_STAGING_BUFFER=state.env["SGLANG_DISAGG_STAGING_BUFFER"])
    _layout(state)
    _round_chunk(state)


def _feature(state: Resolving, **values: Value) -> None:
    state.add(FEATURE.problem(**values))


def _features(state: Resolving) -> None:
    _speculative(state)
    for dest in _UNSUPPORTED:
        if state[dest] is not None:
            _feature(state, **{dest: str(state[dest])})
    tree = state.env.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
    if not state["disable_radix_cache"] and tree != "python":
        _feature(state, SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=tree)
    for dest in _UNSUPPORTED_SWITCHES:
        if state[dest]:
            _feature(state, **{dest: True})
    if state["dcp_size"] > 1:
        _feature(state, dcp_size=state["dcp_size"])
    _hicache(state)
    if state["enable_dynamic_chunking"] and state["pp_size"] > 1:
        _feature(state, enable_dynamic_chunking=True, pp_size=state["pp_size"])


def _speculative(state: Resolving) -> None:
    """Only GLM DSA single-layer NextN MTP with EAGLE and topk 1."""
    algorithm = state["speculative_algorithm"]
    if algorithm is None:
        return
    model = state.model
    glm = model is not None and model.architecture == "GlmMoeDsaForCausalLM"
    nextn_one = model is not None and model.nextn_layers == 1
    topk = state["speculative_eagle_topk"]
    if algorithm != "EAGLE" or not glm or not nextn_one or topk != 1:
        _feature(state, speculative_algorithm=algorithm, speculative_eagle_topk=topk)
    elif state["enable_multi_layer_eagle"]:
        _feature(state, enable_multi_layer_eagle=True)


def _hicache(state: Resolving) -> None:
    if not state["enable_hierarchical_cache"]:
        return
    if state["hicache_storage_backend"] is not None:
        _feature(state, hicache_storage_backend=state["hicache_storage_backend"])
    if state.model is None or not state.model.dsa:
        return
    if state["hicache_host_memory_mode"] != "cache":
        _feature(state, hicache_host_memory_mode=state["hicache_host_memory_mode"])
    layout = state["hicache_mem_layout"]
    if state["hicache_io_backend"] != "kernel" or layout not in ("layer_first", "page_first"):
        _feature(state, hicache_io_backend=state["hicache_io_backend"], hicache_mem_layout=layout)


def _attention_backend(state: Resolving) -> None:
    """validate_kv_shard_attention_backend: DSA needs CUDA interleave CP and TRT-LLM kernels."""
    prefill = state["prefill_attention_backend"] or state["attention_backend"]
    model = state.model
    if prefill == "dsa":
        kpool = (model.index_kpool, model.index_kpool_compress) if model else (1, False)
        _dsa(state, *kpool)
    elif model is not None and model.dsa:
        state.add(ATTENTION_BACKEND.problem(attention_backend=str(prefill)))
    elif prefill is None and model is None:
        state.notes.append("KV sharding's attention-backend rule depends on the model: not checked")
    elif prefill in (None, "fa3"):
        return
    elif prefill != "trtllm_mla" or (model is not None and not model.mla):
        state.add(ATTENTION_BACKEND.problem(attention_backend=prefill))
    elif state["attn_cp_size"] > 1 or state["disable_chunked_prefix_cache"]:
        state.add(
            ATTENTION_BACKEND.problem(
                attention_backend=prefill,
                attn_cp_size=state["attn_cp_size"],
                disable_chunked_prefix_cache=state["disable_chunked_prefix_cache"],
            )
        )


def _dsa(state: Resolving, index_kpool: int, compressed: bool) -> None:
    interleave = state["enable_prefill_cp"] and state["cp_strategy"] == "interleave"
    cp, pp = state["attn_cp_size"], state["pp_size"]
    if state["device"] != "cuda" or not interleave or cp <= 1 or pp != 1:
        state.add(
            DSA_CP.problem(
                device=state["device"],
                enable_prefill_cp=state["enable_prefill_cp"],
                cp_strategy=state["cp_strategy"],
                attn_cp_size=cp,
                pp_size=pp,
            )
        )
    prefill, decode = state["dsa_prefill_backend"], state["dsa_decode_backend"]
    dtype, page = state["kv_cache_dtype"], state["page_size"]
    if prefill != "trtllm" or decode != "trtllm" or dtype != "fp8_e4m3" or page != 64:
        state.add(
            DSA_KERNELS.problem(
                dsa_prefill_backend=prefill,
                dsa_decode_backend=decode,
                kv_cache_dtype=dtype,
                page_size=page,
            )
        )
    backend = state["disaggregation_transfer_backend"]
    split = state["enable_dsa_cache_layer_split"]
    if backend != "mooncake" or split or index_kpool != 1 or compressed:
        state.add(
            DSA_TRANSFER.problem(
                disaggregation_transfer_backend=backend,
                enable_dsa_cache_layer_split=split,
                index_kpool=index_kpool,
            )
        )


def _layout(state: Resolving) -> None:
    model = state.model
    cp, tp = state["attn_cp_size"], state["tp_size"]
    if model is not None and model.mla and cp <= 1:
        if state["attn_dp_size"] > 1 or tp <= 1:
            state.add(
                LAYOUT.problem(attn_cp_size=cp, attn_dp_size=state["attn_dp_size"], tp_size=tp)
            )
    elif model is not None and not model.mla and (not state["enable_prefill_cp"] or cp <= 1):
        state.add(LAYOUT.problem(enable_prefill_cp=state["enable_prefill_cp"], attn_cp_size=cp))
    page, chunk = state["page_size"], state["chunked_prefill_size"]
    if page is not None and page <= 1:
        state.add(LAYOUT.problem(page_size=page))
    if chunk is not None and chunk <= 0:
        state.add(LAYOUT.problem(chunked_prefill_size=chunk))


def _round_chunk(state: Resolving) -> None:
    """Chunks start on page boundaries: the chunk size rounds up to a page multiple."""
    page, chunk = state["page_size"], state["chunked_prefill_size"]
    if page is None or page <= 1 or chunk is None or chunk <= 0 or chunk % page == 0:
        return
    rounded = -(-chunk // page) * page
    state.declare(KV_SHARD_HOOK, chunked_prefill_size=rounded)
    state.notes.append(
        f"--chunked-prefill-size {chunk} rounds up to {rounded}, a multiple of page_size "
        f"{page}, for KV sharding"
    )
    # NOTE: the larger chunk needs more activation memory; a fraction SGLang derived (not one
    # the command gave) gives it up, unrounded (kv_shard_hook.py).
    delta_mib = 1.5 * (max(rounded, 2048) - max(chunk, 2048))
    fraction = state["mem_fraction_static"]
    if state.parsed.values["mem_fraction_static"] is None and delta_mib > 0 and fraction:
        state.declare(KV_SHARD_HOOK, mem_fraction_static=fraction - delta_mib / state.gpu_mib)
