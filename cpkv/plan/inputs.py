"""What ``cpkv plan`` is asked for: the model, the parallel layout, the GPU and the KV
storage; :class:`PlanInputs`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from cpkv.plan.kv_bytes import KvCacheDtype
from cpkv_core.config import MaterializeMode, ModelConfig, WeightDtype
from flags.sglang.memory import MemoryDefaults

DEFAULT_PAGE_SIZE = 64
"""Tokens per KV page of the NSA models."""
DEFAULT_MAX_VIEW_TOKENS = 131072
"""Tokens of the largest materialized view: one 128k-token request."""


class PlanInputs(BaseModel):
    """What a capacity plan is asked for; None means the default described."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    """Model preset name (``deepseek-v3.2``, ``glm-5``, ``deepseek-v3``, ``kimi-k2``,
    ``tiny``), or the name of :attr:`model_dims`."""
    model_dims: ModelConfig | None = None
    """A model read from its ``config.json``; None means the preset :attr:`model` names."""
    gpu_mem_gib: float
    """GPU memory per rank, in GiB (2**30 bytes)."""
    cp_size: int = 1
    """CP ranks sharing the KV; 1 means CP off."""
    attn_cp_size: int | None = None
    """Attention-CP ranks carved out of TP (SGLang's ``--attn-cp-size``, which divides the
    attention TP group even without prefill CP); None means :attr:`cp_size`."""
    tp_size: int | None = None
    """Ranks of the model instance (SGLang's ``--tp``); None means ``dp_attention x cp_size``."""
    ep_size: int = 1
    """Expert-parallel ranks; 1 means experts are TP-sliced."""
    dp_attention: int = 1
    """Attention-DP groups (SGLang's ``--dp`` with ``--enable-dp-attention``); 1 means off."""
    weight_dtype: WeightDtype | None = None
    """Dtype of the linear layers; None means the preset's published checkpoint."""
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO
    """Storage of the MLA latent KV."""
    page_size: int = DEFAULT_PAGE_SIZE
    """Tokens per KV page."""
    mem_fraction_static: float | None = None
    """Share of GPU memory for weights and KV (SGLang's meaning); None derives it."""
    reserve_gib: float | None = None
    """GiB kept for activations and CUDA graphs; sets the fraction to ``1 - reserve/gpu``."""
    chunked_prefill_size: int | None = None
    """Chunk size SGLang's default reserve is sized for; None means SGLang's default."""
    cuda_graph_max_bs: int | None = None
    """CUDA-graph batch SGLang's default reserve is sized for; None means SGLang's default."""
    sglang_memory: MemoryDefaults | None = None
    """SGLang's memory defaults for a launch command on this GPU (its chunk, decode graph
    and derived fraction); None derives them from the layout alone."""
    max_view_tokens: int = DEFAULT_MAX_VIEW_TOKENS
    """Tokens of the largest view (history + current) one batch reads at level >= 2."""
    materialize: MaterializeMode = MaterializeMode.GATHER
    """How the view is built: gather (send slots plus a view padded to the busiest owner)
    or peer-read (the view alone, no padding)."""
    materialize_prefetch: bool = False
    """Layer l+1's view is fetched while layer l computes: a second view buffer."""
