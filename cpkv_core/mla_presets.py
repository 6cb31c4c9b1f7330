"""MLA models without a DSA indexer, planned but not run: :data:`MLA_PRESETS`.

DeepSeek-V3 (and R1, V3.1, which share its shape) and Kimi-K2 store the same MLA latent KV as
DeepSeek-V3.2, with no index K; cpkv shards it by page the same way. Each preset is the
published ``config.json``'s dimensions, counted by :func:`cpkv_core.hf_model.model_from_hf_config`.
The test vehicle runs sparse-attention models only, so these serve ``cpkv plan`` and
``cpkv migrate``.
"""

from __future__ import annotations

from typing import Any

from cpkv_core.hf_model import model_from_hf_config
from cpkv_core.models import MODEL_PRESETS, ModelConfig

_FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}

DEEPSEEK_V3_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "quantization_config": _FP8_BLOCK,
}
"""deepseek-ai/DeepSeek-V3's ``config.json`` (671B parameters without the MTP layer)."""

KIMI_K2_CONFIG: dict[str, Any] = DEEPSEEK_V3_CONFIG | {
    "num_attention_heads": 64,
    "n_routed_experts": 384,
    "first_k_dense_replace": 1,
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
}
"""moonshotai/Kimi-K2-Instruct's ``config.json`` (DeepseekV3ForCausalLM: 64 heads, 384
routed experts, one dense layer; about 1.03T parameters)."""

MLA_PRESETS: dict[str, ModelConfig] = {
    "deepseek-v3": model_from_hf_config(DEEPSEEK_V3_CONFIG, "deepseek-v3"),
    "kimi-k2": model_from_hf_config(KIMI_K2_CONFIG, "kimi-k2"),
}
"""MLA presets without an indexer, by name."""

PLAN_PRESETS: dict[str, ModelConfig] = MODEL_PRESETS | MLA_PRESETS
"""Every model ``cpkv plan`` knows by name: the test vehicle's presets and :data:`MLA_PRESETS`."""


def plan_preset(name: str) -> ModelConfig:
    """The plannable preset called ``name``; raises ValueError naming the choices."""
    try:
        return PLAN_PRESETS[name]
    except KeyError:
        choices = ", ".join(PLAN_PRESETS)
        raise ValueError(f"unknown model preset {name!r}; choose one of: {choices}") from None
