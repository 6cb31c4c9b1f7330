"""Frozen typed configuration: model dimensions with presets, and the CP deployment."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class CpMode(StrEnum):
    """How a batch's current tokens are split over CP ranks."""

    IN_SEQ_SPLIT = "in-seq-split"
    """Zigzag: each request cut into 2*cp_size segments; rank r takes r and 2*cp_size-1-r."""
    ROUND_ROBIN_SPLIT = "round-robin-split"
    """Token g of the batch (flattened over requests) goes to rank g % cp_size."""


class IndexKDtype(StrEnum):
    """Storage dtype of the indexer's key cache."""

    FP8_E4M3 = "fp8-e4m3"
    """fp8 e4m3 with one fp32 scale per token, as DeepSeek-V3.2 and GLM-5 store it."""
    FP32 = "fp32"
    """Plain fp32 keys; the per-token scale is stored as 1.0."""


class DisaggregationMode(StrEnum):
    """The server's role in prefill/decode disaggregation (SGLang's ``--disaggregation-mode``)."""

    NULL = "null"
    """No PD: one server prefills and decodes."""
    PREFILL = "prefill"
    """A prefill server that sends finished KV to a decode server."""
    DECODE = "decode"
    """A decode server that receives KV from prefill servers."""


class TransferBackend(StrEnum):
    """PD KV transfer engine (SGLang's ``--disaggregation-transfer-backend``)."""

    MOONCAKE = "mooncake"
    NIXL = "nixl"
    ASCEND = "ascend"
    FAKE = "fake"


class ModelConfig(BaseModel):
    """Dimensions of a sparse-attention MLA model (MLA latent KV plus an NSA/DSA indexer).

    Only the dimensions that decide KV layout and the test vehicle's math are kept.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Preset name, e.g. ``deepseek-v3.2``."""
    hidden_size: int = Field(ge=1)
    """Width of the residual stream, in elements."""
    num_layers: int = Field(ge=1)
    """Transformer layers, each with its own KV pool."""
    num_heads: int = Field(ge=1)
    """MLA attention heads (queries in the absorbed latent space)."""
    kv_lora_rank: int = Field(ge=1)
    """Width of the MLA compressed latent KV per token, in elements."""
    qk_rope_head_dim: int = Field(ge=0)
    """Width of the decoupled rotary key part stored beside the latent, in elements."""
    index_n_heads: int = Field(ge=1)
    """Indexer query heads."""
    index_head_dim: int = Field(ge=1)
    """Width of the indexer key per token, in elements."""
    index_topk: int = Field(ge=1)
    """Keys the indexer selects for every query."""
    vocab_size: int = Field(ge=2)
    """Vocabulary size (embedding rows and head columns)."""
    seed: int = 0
    """Seed of the deterministic test-vehicle weights; unused for the published presets."""

    @property
    def kv_dim(self) -> int:
        """Elements of MLA latent KV per token: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim


MODEL_PRESETS: dict[str, ModelConfig] = {
    # NOTE: tiny keeps index_topk below typical request lengths so top-k selection is
    # exercised, and a few layers so KV written by one layer is read by the next.
    "tiny": ModelConfig(
        name="tiny",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        index_n_heads=4,
        index_head_dim=32,
        index_topk=16,
        vocab_size=256,
    ),
    # Published config of deepseek-ai/DeepSeek-V3.2-Exp.
    "deepseek-v3.2": ModelConfig(
        name="deepseek-v3.2",
        hidden_size=7168,
        num_layers=61,
        num_heads=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
        vocab_size=129280,
    ),
    # Published config of zai-org/GLM-5 (GlmMoeDsa).
    "glm-5": ModelConfig(
        name="glm-5",
        hidden_size=6144,
        num_layers=78,
        num_heads=64,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        index_n_heads=32,
        index_head_dim=128,
        index_topk=2048,
        vocab_size=154880,
    ),
}


def model_preset(name: str) -> ModelConfig:
    """Returns the preset called ``name``; raises ValueError naming the choices."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        choices = ", ".join(MODEL_PRESETS)
        raise ValueError(f"unknown model preset {name!r}; choose one of: {choices}") from None


class DeploymentConfig(BaseModel):
    """One CP prefill deployment: how many ranks, how tokens are split, how KV is paged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cp_size: int = Field(default=1, ge=1)
    """CP ranks sharing a prefill chunk; 1 means CP is off."""
    cp_mode: CpMode = CpMode.IN_SEQ_SPLIT
    """How current tokens are split over the ranks."""
    page_size: int = Field(default=64, ge=1)
    """Tokens per KV page (64 for NSA models)."""
    index_k_dtype: IndexKDtype = IndexKDtype.FP8_E4M3
    """Storage dtype of the indexer key cache."""
    disaggregation_mode: DisaggregationMode = DisaggregationMode.NULL
    """This server's PD role; ``null`` when prefill and decode share a server."""
    transfer_backend: TransferBackend = TransferBackend.MOONCAKE
    """PD transfer engine; only used when ``disaggregation_mode`` is not ``null``."""
    decode_cp_size: int = Field(default=1, ge=1)
    """CP size of the decode server that receives this prefill server's KV; 1 means no CP."""

    @property
    def pd_backend(self) -> TransferBackend | None:
        """The transfer engine in use, or None without PD."""
        if self.disaggregation_mode is DisaggregationMode.NULL:
            return None
        return self.transfer_backend
