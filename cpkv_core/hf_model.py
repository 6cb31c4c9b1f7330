"""An MLA model's dimensions and weight counts from its Hugging Face ``config.json``:
:func:`model_from_hf_config`.

The counts are the config arithmetic of DeepSeek's MLA layer (the same fields name it in
DeepSeek-V3, V3.2, Kimi-K2 and GLM-5), without the MTP draft layers:

- sharded by heads: ``q_b_proj`` (or ``q_proj`` without a query LoRA), ``kv_b_proj``,
  ``o_proj``;
- replicated: ``q_a_proj``, ``kv_a_proj_with_mqa`` and, for a DSA model, the indexer's
  ``wq_b`` and ``wk``;
- dense MLPs of the first ``first_k_dense_replace`` layers and the shared experts; routed
  experts; embeddings and the LM head (none apart when tied);
- small: norms, the MoE routers (with their ``noaux_tc`` bias) and the indexer's
  ``weights_proj`` and key norm.

``tests/test_hf_model.py`` checks that DeepSeek-V3.2's and GLM-5's published configs give
the presets' counts exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpkv_core.models import ModelConfig, WeightDtype, WeightSpec

MLA_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank")
"""Fields without which a ``config.json`` does not describe an MLA model cpkv can plan."""


class HfConfigError(ValueError):
    """A ``config.json`` that does not describe an MLA model cpkv can plan."""


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: ``text_config`` of a multimodal wrapper, else itself."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping) and "kv_lora_rank" not in config:
        return inner
    return config


def weight_dtype(config: Mapping[str, Any]) -> WeightDtype:
    """The checkpoint's linear-layer dtype: fp8 for FP8 block quantization, else bf16.

    Raises:
        HfConfigError: another quantization (cpkv plans bf16 and fp8 weights).
    """
    quantization = config.get("quantization_config")
    if not quantization:
        return WeightDtype.BF16
    method = str(quantization.get("quant_method", "")).lower()
    if method == "fp8":
        return WeightDtype.FP8
    raise HfConfigError(
        f"quantization_config.quant_method {method!r}: cpkv plans bf16 and fp8 (block "
        "128x128) checkpoints; pass --weight-dtype to plan this one as either"
    )


def model_from_hf_config(config: Mapping[str, Any], name: str) -> ModelConfig:
    """The :class:`ModelConfig` of an MLA model's ``config.json`` (module docstring).

    Raises:
        HfConfigError: a field an MLA model needs is missing or not a positive integer, or
            the quantization is neither bf16 nor fp8.
    """
    text = text_config(config)
    missing = [f for f in MLA_FIELDS if not isinstance(text.get(f), int) or text[f] < 1]
    if missing:
        raise HfConfigError(
            f"config.json of {name!r} lacks {', '.join(missing)} as positive integers: it "
            "does not describe an MLA model (DeepSeek-V3 style latent attention)"
        )
    return ModelConfig(
        name=name,
        hidden_size=text["hidden_size"],
        num_layers=text["num_hidden_layers"],
        num_heads=text["num_attention_heads"],
        kv_lora_rank=text["kv_lora_rank"],
        qk_rope_head_dim=_int(text, "qk_rope_head_dim"),
        index_n_heads=_int(text, "index_n_heads"),
        index_head_dim=_int(text, "index_head_dim"),
        index_topk=_int(text, "index_topk"),
        vocab_size=text.get("vocab_size") or 2,
        max_context_len=text.get("max_position_embeddings") or 65536,
        weights=weight_spec(text, weight_dtype(config)),
    )


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    return int(value) if isinstance(value, int) else 0


def weight_spec(config: Mapping[str, Any], dtype: WeightDtype) -> WeightSpec:
    """Parameter counts of an MLA model's ``config.json`` by where SGLang places them."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_lora = config["num_attention_heads"], config["kv_lora_rank"]
    q_lora = _int(config, "q_lora_rank")
    rope, nope = _int(config, "qk_rope_head_dim"), _int(config, "qk_nope_head_dim")
    v_dim = _int(config, "v_head_dim") or nope
    index_heads, index_dim = _int(config, "index_n_heads"), _int(config, "index_head_dim")
    q_in = q_lora or hidden
    sharded = q_in * heads * (nope + rope) + kv_lora * heads * (nope + v_dim)
    sharded += heads * v_dim * hidden
    replicated = (hidden * q_lora if q_lora else 0) + hidden * (kv_lora + rope)
    small = 2 * hidden + q_lora + kv_lora
    if _int(config, "index_topk"):
        replicated += q_in * index_heads * index_dim + hidden * index_dim
        small += hidden * index_heads + 2 * index_dim
    moe = _moe_layers(config)
    dense = layers - moe
    experts, shared = _int(config, "n_routed_experts"), _int(config, "n_shared_experts")
    expert_width = _int(config, "moe_intermediate_size")
    router = experts * hidden + (experts if config.get("topk_method") == "noaux_tc" else 0)
    vocab = _int(config, "vocab_size")
    return WeightSpec(
        attention_sharded_params=layers * sharded,
        attention_replicated_params=layers * replicated,
        dense_mlp_params=dense * 3 * hidden * _int(config, "intermediate_size")
        + moe * shared * 3 * hidden * expert_width,
        routed_expert_params=moe * experts * 3 * hidden * expert_width,
        embedding_params=vocab * hidden,
        lm_head_params=0 if config.get("tie_word_embeddings") else vocab * hidden,
        small_params=layers * small + moe * router + hidden,
        linear_dtype=dtype,
    )


def _moe_layers(config: Mapping[str, Any]) -> int:
    """Layers with routed experts: from ``first_k_dense_replace``, every ``moe_layer_freq``."""
    if not _int(config, "n_routed_experts"):
        return 0
    first, every = _int(config, "first_k_dense_replace"), _int(config, "moe_layer_freq") or 1
    return sum(1 for layer in range(first, config["num_hidden_layers"]) if layer % every == 0)
