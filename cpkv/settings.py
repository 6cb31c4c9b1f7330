"""What a run uses: the flag sources, overridden by the command's own options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cpkv_core.config import (
    CpMode,
    DeploymentConfig,
    IndexKDtype,
    Launcher,
    MaterializeMode,
    SplitGate,
)
from flags import FlagError, ProblemCode, check_flags, resolve_flags
from phases.ids import PhaseId, parse_phase_list

VALUE_PROBLEMS = frozenset(
    {
        ProblemCode.CP_SIZE_BELOW_ONE,
        ProblemCode.PAGE_SIZE_BELOW_ONE,
        ProblemCode.DECODE_CP_SIZE_BELOW_ONE,
        ProblemCode.MAX_PHASE_OUT_OF_RANGE,
        ProblemCode.CP_MIN_TOKENS_BELOW_ZERO,
        ProblemCode.SHADOW_RATE_OUT_OF_RANGE,
        ProblemCode.BATCH_TIMEOUT_OUT_OF_RANGE,
        ProblemCode.PD_HOST_INVALID,
    }
)
"""Problems that make a run meaningless; combination problems are the gate's to report."""


@dataclass(frozen=True, slots=True)
class RunSettings:
    """The deployment, the enabled phases and the kill-switch ceiling of one run."""

    deploy: DeploymentConfig
    enabled: frozenset[PhaseId]
    ceiling: int | None
    debug_checks: bool
    shadow_rate: float = 0.0
    """Share of batches shadow-verified (``--shadow-rate``)."""
    batch_timeout_s: float = 60.0
    """Seconds a batch's collective waits for a stalled rank (``--batch-timeout-s``)."""
    launcher: Launcher = Launcher.AUTO
    """What starts the CP ranks (``--launcher``)."""
    pd_host: str = "127.0.0.1"
    """Where the PD decode server listens and is reached (``--pd-host``)."""
    pd_local_host: str = "127.0.0.1"
    """What this node's prefill ranks name their Mooncake sessions by (``--pd-local-host``)."""


def resolve_run(
    config: Path | None,
    phases: str | None,
    cp_size: int | None,
    page_size: int | None,
    cp_mode: CpMode | None,
    index_k_dtype: IndexKDtype = IndexKDtype.FP8_E4M3,
    cp_min_tokens: int | None = None,
    split_gate: SplitGate | None = None,
    shadow_rate: float | None = None,
    batch_timeout_s: float | None = None,
    launcher: Launcher | None = None,
    pd_host: str | None = None,
    materialize: MaterializeMode | None = None,
    materialize_prefetch: bool | None = None,
) -> RunSettings:
    """Flag sources (defaults < config < environment) < the command's options.

    ``--cp-size`` turns CP on for the run; ``--phases`` replaces the enabled set;
    ``cp_min_tokens`` is ``--nsa-prefill-cp-min-tokens``; ``split_gate`` is
    ``--cp-split-gate``; ``launcher`` is ``--launcher``;
    ``pd_host`` is ``--pd-host``; ``materialize`` is ``--materialize`` and
    ``materialize_prefetch`` ``--materialize-prefetch``.

    Raises:
        ValueError: a malformed config, environment variable, option or phase list.
    """
    given: dict[str, object] = {
        "page_size": page_size,
        "nsa_prefill_cp_mode": cp_mode,
        "nsa_prefill_cp_min_tokens": cp_min_tokens,
        "cp_split_gate": split_gate,
        "shadow_rate": shadow_rate,
        "batch_timeout_s": batch_timeout_s,
        "launcher": launcher,
        "pd_host": pd_host,
        "materialize": materialize,
        "materialize_prefetch": materialize_prefetch,
    }
    cli = {flag: value for flag, value in given.items() if value is not None}
    if cp_size is not None:
        cli |= {"attn_cp_size": cp_size, "enable_nsa_prefill_context_parallel": True}
    flags = resolve_flags(config, cli).flags
    bad_values = [p for p in check_flags(flags) if p.code in VALUE_PROBLEMS]
    if bad_values:
        raise FlagError("; ".join(f"{p} ({p.hint})" for p in bad_values))
    deploy = DeploymentConfig.model_validate(
        flags.deployment().model_dump() | {"index_k_dtype": index_k_dtype}
    )
    enabled = parse_phase_list(phases) if phases is not None else flags.enabled_phases()
    return RunSettings(
        deploy,
        enabled,
        flags.max_phase,
        flags.debug_cp_shared_kv,
        flags.shadow_rate,
        flags.batch_timeout_s,
        flags.launcher,
        flags.pd_host,
        flags.pd_local_host,
    )
