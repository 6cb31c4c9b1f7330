"""Bytes of one token's KV in one layer, in the storage SGLang uses for NSA models.

Per token per layer an NSA/DSA model stores its MLA latent KV and the indexer's key:

- ``--kv-cache-dtype auto`` or ``bf16``: the latent in bf16, ``(kv_lora_rank +
  qk_rope_head_dim) x 2`` bytes (1,152 for DeepSeek-V3.2 and GLM-5);
- ``fp8_e4m3``: for a DSA model FlashMLA's sparse FP8 layout, ``kv_lora_rank`` fp8 values,
  one fp32 scale per 128 of them and the rope part in bf16: ``512 + 4 x 4 + 64 x 2 = 656``
  bytes; for an MLA model without an indexer one byte a value, ``kv_lora_rank +
  qk_rope_head_dim`` (576 for DeepSeek-V3), as is ``fp8_e5m2`` (which DSA refuses);
- and in both, for a DSA model, the index K: ``index_head_dim`` fp8 bytes plus one fp32
  scale (132 bytes). An MLA model without an indexer (DeepSeek-V3, Kimi-K2) stores the
  latent alone.
"""

from __future__ import annotations

from enum import StrEnum

from cpkv_core.config import ModelConfig

FP8_SCALE_GROUP = 128
"""Latent values sharing one fp32 scale in the FP8 layout."""
SCALE_BYTES = 4
"""Bytes of one fp32 scale."""
BF16_BYTES = 2
"""Bytes of one bf16 value."""


class KvCacheDtype(StrEnum):
    """Storage of the MLA latent KV (SGLang's ``--kv-cache-dtype``)."""

    AUTO = "auto"
    """The model dtype: bf16."""
    BF16 = "bf16"
    """bf16 latent."""
    FP8_E4M3 = "fp8_e4m3"
    """FlashMLA's sparse FP8 layout for DSA (656 bytes for a 512 + 64 latent), else a byte
    a value."""
    FP8_E5M2 = "fp8_e5m2"
    """A byte a value (MLA without an indexer; SGLang's DSA pools refuse it)."""


_ALIASES = {
    "auto": KvCacheDtype.AUTO,
    "bf16": KvCacheDtype.BF16,
    "bfloat16": KvCacheDtype.BF16,
    "fp8_e4m3": KvCacheDtype.FP8_E4M3,
    "fp8_e5m2": KvCacheDtype.FP8_E5M2,
}


def parse_kv_cache_dtype(text: str) -> KvCacheDtype:
    """SGLang's ``--kv-cache-dtype`` value as a :class:`KvCacheDtype`.

    Raises:
        ValueError: a value SGLang's NSA pools do not store (``fp8_e5m2``, ``fp4_e2m1``).
    """
    try:
        return _ALIASES[text.lower()]
    except KeyError:
        choices = ", ".join(_ALIASES)
        raise ValueError(
            f"kv_cache_dtype must be one of {choices} (the MLA pools store the latent as bf16 "
            f"or fp8), got {text!r}"
        ) from None


def latent_bytes_per_token(model: ModelConfig, kv_dtype: KvCacheDtype) -> int:
    """Bytes of one token's MLA latent KV in one layer."""
    if kv_dtype in (KvCacheDtype.FP8_E4M3, KvCacheDtype.FP8_E5M2):
        if not model.has_indexer:
            return model.kv_dim
        scales = -(-model.kv_lora_rank // FP8_SCALE_GROUP)
        return model.kv_lora_rank + scales * SCALE_BYTES + model.qk_rope_head_dim * BF16_BYTES
    return model.kv_dim * BF16_BYTES


def kv_bytes_per_token_per_layer(model: ModelConfig, kv_dtype: KvCacheDtype) -> int:
    """Bytes of one token in one layer: the latent plus, for a DSA model, the fp8 index K and
    its fp32 scale.

    1,284 (bf16) or 788 (fp8_e4m3) for DeepSeek-V3.2 and GLM-5; 1,152 (bf16) for DeepSeek-V3.
    """
    index = model.index_head_dim + SCALE_BYTES if model.has_indexer else 0
    return latent_bytes_per_token(model, kv_dtype) + index
