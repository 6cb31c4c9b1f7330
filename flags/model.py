"""The typed flag set, named after SGLang's server arguments, and each flag's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from cpkv_core.config import (
    CpMode,
    DeploymentConfig,
    DisaggregationMode,
    Launcher,
    MaterializeMode,
    SplitGate,
    TransferBackend,
)
from phases.ids import PhaseId


class FlagError(ValueError):
    """A flag value, config file, environment variable or SGLang argument is malformed."""


class FlagSet(BaseModel):
    """Every flag cpkv reads, with its default.

    Sizes are not range-checked here so that :func:`flags.check_flags` can report every bad
    value together with every bad combination; :meth:`deployment` refuses them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    enable_nsa_prefill_context_parallel: bool = False
    """Turn on context-parallel prefill for NSA models; no phase applies while it is off."""
    nsa_prefill_cp_mode: CpMode = CpMode.IN_SEQ_SPLIT
    """How current tokens are split over CP ranks: in-seq-split (zigzag) or round-robin-split."""
    attn_cp_size: int = 1
    """CP ranks sharing a prefill chunk (>= 1); used only while CP is on."""
    page_size: int = 64
    """Tokens per KV page (>= 1; 64 for NSA models)."""
    nsa_prefill_cp_min_tokens: int = 0
    """A batch with fewer current tokens runs unsplit on every CP rank (>= 0; 0 = always split)."""
    cp_split_gate: SplitGate = SplitGate.SGLANG
    """Which batches are split: sglang (as SGLang 0.5.23 decides) or split-anyway (every batch)."""
    enable_nsa_prefill_cp_narrow_output: bool = False
    """Phase 1: gather only each request's last-token hidden state at the tail."""
    enable_nsa_prefill_cp_shared_kv: bool = False
    """Phase 2: shard persistent MLA KV and index K by page owner instead of replicating it."""
    enable_nsa_prefill_cp_current_reuse: bool = False
    """Phase 3 (needs 2): current-only batches read the gathered chunk instead of materializing."""
    enable_nsa_prefill_cp_page_aligned_split: bool = False
    """Phase 4 (needs 2): one compute owner per page: the zigzag cut at page boundaries
    (in-seq-split) or a page interleave, page p to its owner p % cp (round-robin-split)."""
    enable_nsa_prefill_cp_compute_owner_write: bool = False
    """Phase 5 (needs 4): each rank writes the KV it computed straight into its own pool."""
    materialize: MaterializeMode = MaterializeMode.GATHER
    """How sharded reads (phase 2) build their view: gather (all-gather every page read) or
    peer-read (history pages from the owners' pools in shared memory; ranks on one host)."""
    materialize_prefetch: bool = False
    """Fetch layer l+1's history view while layer l computes; costs a second view buffer."""
    disaggregation_mode: DisaggregationMode = DisaggregationMode.NULL
    """PD role of this server: null (no PD), prefill or decode."""
    disaggregation_transfer_backend: TransferBackend = TransferBackend.MOONCAKE
    """PD KV transfer engine; only read when disaggregation-mode is not null."""
    disaggregation_decode_cp_size: int = 1
    """CP size of the decode server receiving this prefill server's KV; 1 means no CP there."""
    pd_host: str = "127.0.0.1"
    """Address of the PD decode server: its control listener and Mooncake session bind there."""
    pd_local_host: str = "127.0.0.1"
    """Address this node's prefill ranks give their Mooncake sessions; set it on each node."""
    launcher: Launcher = Launcher.AUTO
    """What starts CP ranks: spawn (here), torchrun (one rank a process), auto (torchrun if set)."""
    shadow_rate: float = 0.0
    """Share of batches (0..1) run twice and compared: the chosen path against its fallback."""
    batch_timeout_s: float = 60.0
    """Seconds a batch's collective waits for a stalled rank, then the run stops naming it (> 0)."""
    debug_cp_shared_kv: bool = False
    """Environment only: runtime invariant checks; they may synchronise, so not for benchmarks."""
    max_phase: int | None = None
    """Environment only: kill switch, no phase above this number is active (0..5; unset = none)."""
    decision_log: str | None = None
    """Environment only: the SGLang plugin appends its batch decisions here (JSON Lines; {rank}
    is the rank, else rank 0 writes); cpkv explain --decision-log reads it."""

    def phase_flag(self, phase: PhaseId) -> bool:
        """True when ``phase``'s own flag is on (whether or not CP is on)."""
        return bool(getattr(self, PHASE_FIELDS[phase]))

    def flagged_phases(self) -> frozenset[PhaseId]:
        """Phases whose own flag is on, whether or not CP is on."""
        return frozenset(p for p in PhaseId if self.phase_flag(p))

    def enabled_phases(self) -> frozenset[PhaseId]:
        """The enabled set the gate is handed: flagged phases, or none while CP is off.

        The ceiling is not applied here: hand :attr:`max_phase` to the gate as its
        ``ceiling`` so that a capped phase is reported as ``CEILING``, not ``DISABLED``.
        """
        if not self.enable_nsa_prefill_context_parallel:
            return frozenset()
        return self.flagged_phases()

    def deployment(self) -> DeploymentConfig:
        """The deployment these flags describe; ``cp_size`` is 1 while CP is off.

        Raises:
            FlagError: ``attn_cp_size``, ``page_size`` or the decode CP size is below 1, or
                the CP minimum tokens below 0.
        """
        sizes = (
            ("cp_size", "attn_cp_size"),
            ("page_size", "page_size"),
            ("decode_cp_size", "disaggregation_decode_cp_size"),
        )
        for key, name in sizes:
            value = getattr(self, name)
            if value < 1:
                raise FlagError(f"{key} must be >= 1, got {value} (flag {FLAG_SPECS[name].cli})")
        if self.nsa_prefill_cp_min_tokens < 0:
            raise FlagError(
                f"cp_min_tokens must be >= 0, got {self.nsa_prefill_cp_min_tokens} "
                f"(flag {FLAG_SPECS['nsa_prefill_cp_min_tokens'].cli})"
            )
        return DeploymentConfig(
            cp_size=self.attn_cp_size if self.enable_nsa_prefill_context_parallel else 1,
            cp_mode=self.nsa_prefill_cp_mode,
            page_size=self.page_size,
            disaggregation_mode=self.disaggregation_mode,
            transfer_backend=self.disaggregation_transfer_backend,
            decode_cp_size=self.disaggregation_decode_cp_size,
            cp_min_tokens=self.nsa_prefill_cp_min_tokens,
            split_gate=self.cp_split_gate,
            materialize=self.materialize,
            materialize_prefetch=self.materialize_prefetch,
        )


PHASE_FIELDS: dict[PhaseId, str] = {
    PhaseId.NARROW_OUTPUT: "enable_nsa_prefill_cp_narrow_output",
    PhaseId.SHARDED_KV: "enable_nsa_prefill_cp_shared_kv",
    PhaseId.CURRENT_REUSE: "enable_nsa_prefill_cp_current_reuse",
    PhaseId.PAGE_ALIGNED_SPLIT: "enable_nsa_prefill_cp_page_aligned_split",
    PhaseId.COMPUTE_OWNER_WRITE: "enable_nsa_prefill_cp_compute_owner_write",
}
"""Each phase's field in :class:`FlagSet`."""

PHASE_FLAGS: dict[PhaseId, str] = {
    p: "--" + field.replace("_", "-") for p, field in PHASE_FIELDS.items()
}
"""Each phase's command-line flag, e.g. ``--enable-nsa-prefill-cp-shared-kv``."""


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """The names of one flag in every source it can come from."""

    field: str
    """Attribute of :class:`FlagSet`, e.g. ``attn_cp_size``."""
    env: str
    """Environment variable, e.g. ``CPKV_ATTN_CP_SIZE``."""
    cli: str | None
    """Command-line flag, e.g. ``--attn-cp-size``; None for environment-only knobs."""
    help: str
    """One line of help (the field's docstring)."""

    @property
    def toml_key(self) -> str | None:
        """Key in the config file: the CLI flag without ``--``; None for environment-only knobs."""
        return self.cli[2:] if self.cli else None

    @property
    def env_only(self) -> bool:
        """True for knobs read only from the environment."""
        return self.cli is None


ENV_PREFIX = "CPKV_"
"""Prefix of the environment variable of every server flag: ``CPKV_`` + the field upper-cased."""

_ENV_ONLY = {
    "debug_cp_shared_kv": "SGLANG_DEBUG_CP_SHARED_KV",
    "max_phase": "CPKV_MAX_PHASE",
    "decision_log": "CPKV_DECISION_LOG",
}


def _spec(field: str, help_text: str | None) -> FlagSpec:
    if field in _ENV_ONLY:
        return FlagSpec(field, _ENV_ONLY[field], None, help_text or "")
    cli = "--" + field.replace("_", "-")
    return FlagSpec(field, ENV_PREFIX + field.upper(), cli, help_text or "")


FLAG_SPECS: dict[str, FlagSpec] = {
    name: _spec(name, info.description) for name, info in FlagSet.model_fields.items()
}
"""Every flag's names, in :class:`FlagSet` field order."""


def field_type(name: str) -> Any:
    """The annotation of :class:`FlagSet` field ``name`` (``bool``, ``int``, an enum, ...)."""
    annotation = FlagSet.model_fields[name].annotation
    assert annotation is not None, f"FlagSet.{name} has no annotation"
    return annotation


TOML_KEYS: dict[str, str] = {s.toml_key: s.field for s in FLAG_SPECS.values() if s.toml_key}
"""Config-file key to field name."""


def debug_benchmark_warning(flags: FlagSet) -> str | None:
    """The warning to print when a benchmark runs with the debug invariant checks on, else None."""
    if not flags.debug_cp_shared_kv:
        return None
    return (
        "SGLANG_DEBUG_CP_SHARED_KV is on: runtime invariant checks may synchronise the "
        "device, so timings are not representative; unset it for performance runs"
    )
