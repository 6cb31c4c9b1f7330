"""Frozen typed configuration: the CP deployment and its enums; model dimensions and presets
live in ``models.py`` and are re-exported here."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from cpkv_core.models import MODEL_PRESETS, ModelConfig, WeightDtype, WeightSpec, model_preset

__all__ = [
    "MODEL_PRESETS",
    "CpMode",
    "DeploymentConfig",
    "DisaggregationMode",
    "IndexKDtype",
    "Launcher",
    "MaterializeMode",
    "ModelConfig",
    "SplitGate",
    "TransferBackend",
    "WeightDtype",
    "WeightSpec",
    "model_preset",
]


class CpMode(StrEnum):
    """How a batch's current tokens are split over CP ranks."""

    IN_SEQ_SPLIT = "in-seq-split"
    """Zigzag: each request cut into 2*cp_size segments; rank r takes r and 2*cp_size-1-r."""
    ROUND_ROBIN_SPLIT = "round-robin-split"
    """Token g of the batch (flattened over requests) goes to rank g % cp_size."""


class SplitGate(StrEnum):
    """Which batches a CP deployment splits over its ranks."""

    SGLANG = "sglang"
    """As SGLang 0.5.23 does (``srt/layers/cp/zigzag.py`` and ``interleave.py``,
    ``can_apply``): zigzag runs a batch unsplit when any request has fewer than
    ``2 * cp_size`` current tokens, interleave when the batch has fewer than ``cp_size``."""
    SPLIT_ANYWAY = "split-anyway"
    """cpkv's own: split every batch, however short (a rank may get no token)."""


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
    MORI = "mori"
    MOONCAKE_TCP = "mooncake_tcp"
    """Mooncake forced onto its TCP transport; SGLang runs it as ``mooncake``."""


class Launcher(StrEnum):
    """What starts the CP ranks of a run."""

    AUTO = "auto"
    """torchrun when this process runs under torchrun (``RANK``, ``WORLD_SIZE`` set), else spawn."""
    SPAWN = "spawn"
    """This process spawns every rank on this machine (a ``file://`` rendezvous)."""
    TORCHRUN = "torchrun"
    """torch's own launcher started this process as one rank (``env://`` rendezvous); the
    ranks may span machines."""


class MaterializeMode(StrEnum):
    """How a sharded rank builds the view of the history pages a batch reads."""

    GATHER = "gather"
    """All-gather every page the batch reads; each owner pads its slots to the busiest
    owner's count."""
    PEER_READ = "peer-read"
    """Read history pages straight from the owners' pools mapped in this host's shared
    memory (one host only): no collective, no padding; the current chunk keeps its
    all-gather."""


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
    cp_min_tokens: int = Field(default=0, ge=0)
    """Batches with fewer current tokens than this run unsplit: every CP rank computes every
    token (the ``none`` split); 0 means every batch is split."""
    split_gate: SplitGate = SplitGate.SGLANG
    """Which batches are split at all: as SGLang 0.5.23 decides (``sglang``), or every batch
    (``split-anyway``); ``cp_min_tokens`` applies on top of either."""
    materialize: MaterializeMode = MaterializeMode.GATHER
    """How sharded reads build their view: ``gather`` (a collective) or ``peer-read``
    (owners' pools in shared memory; every rank on one host)."""
    materialize_prefetch: bool = False
    """Fetch layer l+1's history view while layer l computes (two key buffers)."""

    @property
    def pd_backend(self) -> TransferBackend | None:
        """The transfer engine in use, or None without PD."""
        if self.disaggregation_mode is DisaggregationMode.NULL:
            return None
        if self.transfer_backend is TransferBackend.MOONCAKE_TCP:
            return TransferBackend.MOONCAKE
        return self.transfer_backend
