"""Each SGLang 0.5.23 start-up rule cpkv enforces fires, with its text and file, on a corpus
command SGLang refuses for that reason (``tests/data/sglang_corpus.jsonl`` and
``sglang_corpus_b.jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flags import read_sglang
from flags.sglang import encoder, experts, model_config, model_rules
from flags.sglang.kv_shard import (
    ATTENTION_BACKEND,
    DSA_CP,
    DSA_KERNELS,
    DSA_TRANSFER,
    FEATURE,
    KV_RULES,
    LAYOUT,
    PD_PREFILL_ONLY,
    TRANSFER_BACKEND,
)
from flags.sglang.rules import RULES, SglangRule

CORPUS: dict[str, dict[str, Any]] = {
    row["id"]: row
    for name in ("sglang_corpus.jsonl", "sglang_corpus_b.jsonl")
    for row in map(json.loads, (Path(__file__).parent / "data" / name).read_text().splitlines())
}

CASES: list[tuple[SglangRule, str]] = [
    (RULES["attn_dp_below_one"], "dsv32-attn-dp0"),
    (RULES["attn_dp_with_replicas"], "dsv32-attn-dp-and-dp-no-cp"),
    (RULES["cp_attn_dp_with_replicas"], "glm5-attn-dp-and-dp"),
    (RULES["attn_dp_indivisible"], "dsv32-attn-dp3-indivisible"),
    (RULES["cp_strategy_unset"], "dsv32-no-strategy-refused"),
    (RULES["cp_zigzag_dsv32"], "dsv32-zigzag-refused"),
    (RULES["cp_tp_above_8"], "dsv32-tp16-refused"),
    (RULES["cp_tp_above_8"], "glm5-tp16-zigzag-refused"),
    (RULES["cp_on_decode"], "glm5-cp-on-decode-refused"),
    (RULES["cp_indivisible"], "dsv32-interleave-cp3-indivisible"),
    (RULES["cp_indivisible"], "glm5-interleave-attn-cp4-attn-dp4"),
    (RULES["moe_dp"], "glm5-moe-dp2-without-cp"),
    (RULES["moe_dp"], "glm5-zigzag-moe-dp8"),
    (RULES["dcp_below_one"], "dsv32-dcp0"),
    (RULES["dcp_with_prefill_cp"], "glm5fp8-dcp-with-cp"),
    (RULES["dcp_comm_without_dcp"], "dcp-comm-without-dcp"),
    (RULES["dcp_replicate_q_without_dcp"], "dcp-replicate-without-dcp"),
    (RULES["dcp_replicate_q_comm"], "dcp-replicate-ag-rs"),
    (RULES["dsa_dcp_hicache"], "dcp-dsa-hicache"),
    (RULES["dsa_dcp_pd"], "dcp-dsa-decode-worker"),
    (RULES["dsa_dcp_pd"], "dcp-dsa-prefill-worker"),
    (RULES["dsa_dcp_eagle_topk"], "dcp-dsa-eagle-topk"),
    (RULES["dsa_dcp_index_kpool"], "dcp-dsa-index-kpool4"),
    (RULES["trtllm_mla_blackwell"], "page-dsv3-trtllm-mla"),
    (RULES["cutedsl_mla_blackwell"], "page-dsv3-cutedsl"),
    (RULES["hicache_without_radix"], "cache-hicache-without-radix"),
    (RULES["dsa_layer_split_not_dsa"], "layer-split-dsv3"),
    (RULES["pd_prefill_fake"], "glm5-prefill-fake"),
    (RULES["pd_staging_backend"], "env-staging-buffer-ascend"),
    (RULES["dsa_kv_dtype"], "glm5-kv-dtype-fp8-e5m2"),
    (RULES["dsa_backend_rocm_only"], "glm5-dsa-triton-on-cuda"),
    (RULES["dsa_backend_tilelang_fp8"], "glm5-tilelang-fp8-mixed"),
    (RULES["dsa_layer_split"], "glm5-layer-split-without-pd"),
    (PD_PREFILL_ONLY, "dsv32-kv-sharding-no-pd"),
    (PD_PREFILL_ONLY, "dsv32-kv-sharding-decode"),
    (DSA_CP, "glm5-kv-sharding-zigzag"),
    (DSA_CP, "glm5-kv-sharding-pp2"),
    (DSA_CP, "dsv32-kv-sharding-cp-off"),
    (DSA_KERNELS, "glm5-kv-sharding-bf16"),
    (DSA_KERNELS, "dsv32-kv-sharding-default-kernels"),
    (DSA_TRANSFER, "glm5-kv-sharding-nixl"),
    (DSA_TRANSFER, "glm5-kv-sharding-layer-split"),
    (ATTENTION_BACKEND, "dsv32-kv-sharding-attn-backend-fa3"),
    (ATTENTION_BACKEND, "dsv3-mla-kv-sharding-flashinfer"),
    (TRANSFER_BACKEND, "dsv3-mla-kv-sharding-ascend"),
    (LAYOUT, "qwen3-kv-sharding-no-cp"),
    (LAYOUT, "dsv3-mla-kv-sharding-page1"),
    (LAYOUT, "dsv3-mla-kv-sharding-attn-dp"),
    (LAYOUT, "dsv32-kv-sharding-chunked-off"),
    (FEATURE, "dsv32-kv-sharding-tbo"),
    (FEATURE, "dsv32-kv-sharding-hicache-storage"),
    (FEATURE, "dsv32-kv-sharding-eagle"),
    (FEATURE, "dsv32-kv-sharding-streaming-session"),
    (FEATURE, "dsv32-kv-sharding-rust-tree"),
    (FEATURE, "dsv32-kv-sharding-lmcache"),
    (FEATURE, "env-staging-buffer-kv"),
    (RULES["hyv4_prefill_cp"], "model-local-hyv4-cp"),
    (RULES["hyv4_dcp"], "model-local-hyv4-dcp"),
    (model_rules.SINK_BACKEND_RULE, "model-local-hyv4-decode-fa3"),
    (model_rules.SINK_KV_DTYPE, "model-local-hyv4-fp8"),
    (model_rules.TILELANG_HISPARSE, "dsa-hisparse-tilelang-fp8"),
    (model_rules.TILELANG_DCP, "dsa-tilelang-fp8-dcp"),
    (encoder.LANGUAGE_MODEL_ONLY_WITH, "epd-kimi-k25-lm-only-language-only"),
    (encoder.LANGUAGE_MODEL_ONLY_WITH, "epd-qwen3-hub-lm-only"),
    (encoder.LANGUAGE_MODEL_ONLY_PD, "epd-kimi-k25-lm-only-pd"),
    (encoder.LANGUAGE_MODEL_ONLY_MODEL, "epd-dsv32-lm-only"),
    (encoder.LANGUAGE_MODEL_ONLY_MODEL, "model-local-kimi-k25-lm-only"),
    (encoder.PREFIX_MM_CACHE, "epd-kimi-k25-prefix-mm-cache"),
    (encoder.BOTH_ROLES, "epd-kimi-k25-both-roles"),
    (encoder.ENCODER_WITH_PD, "epd-kimi-k25-encoder-pd"),
    (encoder.ENCODER_MODEL, "epd-qwen3-encoder-only"),
    (encoder.ENCODER_MODEL, "epd-dsv32-language-only"),
    (encoder.ENCODER_MODEL, "model-local-llava-llama-language-only"),
    (experts.EPLB_WITHOUT_EP, "eplb-without-ep"),
    (experts.DISPATCH_WITHOUT_A2A, "ep-dispatch-static-without-a2a"),
    (experts.DP_LM_HEAD_WITHOUT_ATTN_DP, "dp-lm-head-with-replicas"),
    (experts.TP_LM_HEAD_A2A_WITHOUT_ATTN_DP, "tp-lm-head-a2a-without-attn-dp"),
    (experts.TP_LM_HEAD_A2A_WITH_DP_LM_HEAD, "tp-lm-head-a2a-with-dp-lm-head"),
    (experts.TP_LM_HEAD_A2A_LAYOUT, "tp-lm-head-a2a-attn-dp-below-tp"),
    (model_config.QUANTIZATION, "quant-fp8-checkpoint-w4afp8"),
    (model_config.QUANTIZATION, "quant-fp8-checkpoint-modelopt-fp8"),
    (model_config.QUANTIZATION, "quant-folder-fp8-w8a8"),
    (model_config.QUANTIZATION, "quant-override-config-fp8"),
    (model_config.CONTEXT_LENGTH, "context-above-derived"),
    (model_config.CONTEXT_LENGTH, "context-above-env-on-ignored"),
    (model_config.CONTEXT_LENGTH, "context-kimi-k25-text-config"),
    (model_config.DSA_INDEX_HEAD_DIM, "override-index-topk-dsv3-folder"),
    (model_config.DSA_INDEX_HEAD_DIM, "override-index-topk-dsv3-name"),
    (model_config.TBO_INDEX_SHARING, "tbo-hyv4-index-sharing"),
    (model_config.NVFP4_ONLINE_BLACKWELL, "quant-nvfp4-online-hopper"),
    (model_config.UNKNOWN_QUANTIZATION, "quant-gptq-unknown-on-cuda"),
    (model_config.OVERRIDES_NOT_AN_OBJECT, "override-not-json"),
    (model_config.OVERRIDES_NOT_AN_OBJECT, "override-json-list"),
]
"""Every rule, with the corpus commands that break it."""


@pytest.mark.parametrize(
    ("rule", "case"), CASES, ids=[f"{rule.code}-{case}" for rule, case in CASES]
)
def test_the_rule_fires_with_its_text_and_file(rule: SglangRule, case: str) -> None:
    assert CORPUS[case]["sglang"]["verdict"] == "refused", "SGLang must refuse the case"
    problems = read_sglang(CORPUS[case]["command"]).problems
    fired = [p for p in problems if p.code is rule.code and p.detail == rule.text]
    assert fired, [str(p) for p in problems]
    assert fired[0].source == f"sglang 0.5.23 {rule.file}"


def test_every_rule_has_a_case() -> None:
    covered = {id(rule) for rule, _ in CASES}
    every = [
        *RULES.values(),
        *KV_RULES,
        *model_rules.MODEL_RULES,
        *encoder.ENCODER_RULES,
        *model_config.MODEL_CONFIG_RULES,
        *experts.EXPERT_RULES,
    ]
    missing = [r.code for r in every if id(r) not in covered]
    assert not missing, missing


@pytest.mark.parametrize(
    ("case", "cp_size", "ep_size", "page_size"),
    [
        ("dsv32-interleave-cp-from-tp", 8, 1, 64),
        ("glm5-zigzag-attn-cp4", 8, 8, 64),
        ("dsv32-interleave-explicit-cp4", 4, 1, 64),
        ("dsv32-dp-under-cp", 4, 1, 64),
        ("dsv3-mla-tp16", 16, 16, 1),
        ("qwen3-prefill-cp-no-size", 1, 1, 1),
        ("dsv32-page0-accepted", 1, 1, 64),
        ("glm5-deepep-ep", 1, 8, 64),
    ],
)
def test_resolves_cp_ep_and_page_as_sglang(
    case: str, cp_size: int, ep_size: int, page_size: int
) -> None:
    resolution = read_sglang(CORPUS[case]["command"]).sglang
    assert (resolution.cp_size, resolution.values["ep_size"], resolution.values["page_size"]) == (
        cp_size,
        ep_size,
        page_size,
    )


def test_kv_sharding_rounds_the_chunk_up_to_a_page_multiple() -> None:
    imported = read_sglang(CORPUS["dsv32-kv-sharding-chunk-rounding"]["command"])
    assert imported.sglang.values["chunked_prefill_size"] == 10048
    assert any("rounds up to 10048" in note for note in imported.resolved.notes)


def test_a_preset_s_model_rules_replace_the_model_path_s() -> None:
    command = CORPUS["qwen3-prefill-cp-no-size"]["command"]
    assert read_sglang(command).sglang.cp_size == 1
    assert read_sglang(command, preset="glm-5").sglang.cp_size == 8
