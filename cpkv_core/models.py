"""Model dimensions and weights (frozen), and the presets: DeepSeek-V3.2, GLM-5 and the tiny
CPU test vehicle; :func:`model_preset` is the entry point."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class WeightDtype(StrEnum):
    """Storage of a checkpoint's linear-layer weights, as published."""

    FP8 = "fp8"
    """fp8 e4m3 with one fp32 scale per 128x128 block (DeepSeek's FP8 checkpoint format)."""
    BF16 = "bf16"
    """Plain bf16, 2 bytes a parameter."""


class WeightSpec(BaseModel):
    """Parameter counts of a checkpoint, grouped by how SGLang places them on ranks.

    Counts cover every layer the server loads for prefill; the MTP (next-n) layer, loaded
    only for speculative decoding, is left out. Embeddings, the LM head, norms and routers
    stay bf16 in the FP8 checkpoints; the other groups are stored in ``linear_dtype``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention_sharded_params: int = Field(ge=0)
    """MLA ``q_b_proj``, ``kv_b_proj`` and ``o_proj``, all layers: split over attention TP."""
    attention_replicated_params: int = Field(ge=0)
    """MLA ``q_a_proj`` and ``kv_a_proj_with_mqa``, indexer ``wq_b`` and ``wk``, all layers:
    every rank holds them whole."""
    dense_mlp_params: int = Field(ge=0)
    """MLPs of the dense layers and the shared experts: split over TP."""
    routed_expert_params: int = Field(ge=0)
    """Routed experts of every MoE layer: split over TP (EP groups times MoE TP)."""
    embedding_params: int = Field(ge=0)
    """Input embeddings (``vocab_size x hidden_size``), bf16: split over TP, whole under DP
    attention."""
    lm_head_params: int = Field(ge=0)
    """The LM head (``hidden_size x vocab_size``, untied), bf16: split over TP."""
    small_params: int = Field(ge=0)
    """Norms, MoE routers and indexer ``weights_proj``, bf16: every rank holds them whole."""
    linear_dtype: WeightDtype
    """Dtype of the published checkpoint's linear layers (attention, MLPs, experts)."""
    published_total_params: int | None = None
    """Total parameters on the model card (main model), to check the counts against."""
    published_active_params: int | None = None
    """Activated parameters per token on the model card."""

    @property
    def total_params(self) -> int:
        """Sum of every group."""
        return (
            self.attention_sharded_params
            + self.attention_replicated_params
            + self.dense_mlp_params
            + self.routed_expert_params
            + self.embedding_params
            + self.lm_head_params
            + self.small_params
        )


class ModelConfig(BaseModel):
    """Dimensions of an MLA model: its latent KV and, for a sparse-attention (NSA/DSA)
    model, the indexer.

    Only the dimensions that decide KV layout and the test vehicle's math are kept. A model
    without an indexer (DeepSeek-V3, Kimi-K2) has all three ``index_*`` fields 0; it can be
    planned but not run by the test vehicle, which needs the indexer.
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
    index_n_heads: int = Field(ge=0)
    """Indexer query heads; 0 means no indexer."""
    index_head_dim: int = Field(ge=0)
    """Width of the indexer key per token, in elements; 0 means no indexer."""
    index_topk: int = Field(ge=0)
    """Keys the indexer selects for every query; 0 means no indexer."""
    vocab_size: int = Field(ge=2)
    """Vocabulary size (embedding rows and head columns)."""
    seed: int = 0
    """Seed of the deterministic test-vehicle weights; unused for the published presets."""
    max_context_len: int = Field(default=65536, ge=1)
    """Longest sequence the model takes (``max_position_embeddings``), in tokens."""
    weights: WeightSpec | None = None
    """Parameter counts and dtype of the checkpoint, for capacity planning; None if unknown."""

    @model_validator(mode="after")
    def _indexer_whole(self) -> ModelConfig:
        sizes = (self.index_n_heads, self.index_head_dim, self.index_topk)
        if any(sizes) and not all(sizes):
            raise ValueError(
                "index_n_heads, index_head_dim and index_topk are all 0 (no indexer) or all "
                f"positive, got {sizes}"
            )
        return self

    @property
    def has_indexer(self) -> bool:
        """A DSA model: the indexer picks each query's top-k keys."""
        return self.index_topk > 0

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
        max_context_len=65536,
        # NOTE: the test vehicle's own tensors (cpkv_core/model.py), planned as bf16.
        weights=WeightSpec(
            attention_sharded_params=2 * (64 * 4 * 48 + 4 * 32 * 64),
            attention_replicated_params=2 * (64 * 48 + 64 * 4 * 32 + 64 * 32),
            dense_mlp_params=0,
            routed_expert_params=0,
            embedding_params=256 * 64 + 65536 * 64,
            lm_head_params=64 * 256,
            small_params=2 * (64 + 64 * 4) + 64,
            linear_dtype=WeightDtype.BF16,
        ),
    ),
    # Published config of deepseek-ai/DeepSeek-V3.2-Exp; weights: see the docstring below.
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
        max_context_len=163840,
        weights=WeightSpec(
            attention_sharded_params=10_489_954_304,
            attention_replicated_params=1_746_993_152,
            dense_mlp_params=3_743_416_320,
            routed_expert_params=653_908_770_816,
            embedding_params=926_679_040,
            lm_head_params=926_679_040,
            small_params=135_451_392,
            linear_dtype=WeightDtype.FP8,
            published_total_params=671_000_000_000,
            published_active_params=37_000_000_000,
        ),
    ),
    # Published config of zai-org/GLM-5 (GlmMoeDsa); weights: see the docstring below.
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
        max_context_len=202752,
        weights=WeightSpec(
            attention_sharded_params=11_614_027_776,
            attention_replicated_params=1_973_157_888,
            dense_mlp_params=3_510_632_448,
            routed_expert_params=724_775_731_200,
            embedding_params=951_582_720,
            lm_head_params=951_582_720,
            small_params=134_503_680,
            linear_dtype=WeightDtype.FP8,
            published_total_params=744_000_000_000,
            published_active_params=40_000_000_000,
        ),
    ),
}
"""Model presets by name.

``deepseek-v3.2``: dimensions from ``config.json`` of deepseek-ai/DeepSeek-V3.2-Exp on
Hugging Face (hidden 7168, 61 layers of which the first 3 dense, 128 heads, q_lora_rank
1536, kv_lora_rank 512, qk_nope/rope 128/64, v_head_dim 128, 256 routed experts and 1
shared of moe_intermediate_size 2048, dense intermediate_size 18432, vocab 129280, indexer
64 heads x 128, max_position_embeddings 163840). The model card gives 671B total and 37B
activated parameters (its "685B" adds the 14B MTP module) and ships FP8 weights (e4m3,
128x128 block scales). The counts are the config arithmetic, e.g. routed experts
``58 layers x 256 x 3 x 7168 x 2048 = 653.9B``; they sum to 671.9B (the indexer adds
0.85B to DeepSeek-V3's 671B).

``glm-5``: dimensions from ``config.json`` of zai-org/GLM-5 (GlmMoeDsa: hidden 6144, 78
layers of which the first 3 dense, 64 heads, q_lora_rank 2048, kv_lora_rank 512, qk_nope/
rope 192/64, v_head_dim 256, 256 routed experts and 1 shared of 2048, dense 12288, vocab
154880, indexer 32 heads x 128, max_position_embeddings 202752). The model card gives 744B
total and 40B active parameters; zai-org/GLM-5 is bf16 and zai-org/GLM-5-FP8 fp8. The
preset plans the FP8 checkpoint (``--model-path zai-org/GLM-5`` plans bf16). The counts sum
to 743.9B.

``tiny``: the CPU test vehicle (``cpkv_core/model.py``), counted from its own tensors.
"""


def model_preset(name: str) -> ModelConfig:
    """Returns the preset called ``name``; raises ValueError naming the choices."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        choices = ", ".join(MODEL_PRESETS)
        raise ValueError(f"unknown model preset {name!r}; choose one of: {choices}") from None
