"""What a run uses: the flag sources, overridden by the command's own options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cpkv_core.config import DeploymentConfig, IndexKDtype, Launcher
from cpkv_core.runtime import Fault
from flags import FlagError, ProblemCode, check_flags, resolve_flags
from phases.gate import levels_of
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
    device: str = "cpu"
    """Where weights, pools, the reference and the run step live (``--device``)."""
    fault: Fault | None = None
    """A game-day fault injected into the candidate path it targets (``--inject-fault``)."""

    def levels(self) -> tuple[int, ...]:
        """Level 0 up to the highest enabled phase, none above the ceiling: what a verify
        run and a dry run run."""
        return tuple(
            lv for lv in levels_of(self.enabled) if self.ceiling is None or lv <= self.ceiling
        )

    def top_level(self) -> int:
        """The highest enabled level, capped at the ceiling: what ``cpkv pd`` prefills at."""
        level = levels_of(self.enabled)[-1]
        return level if self.ceiling is None else min(level, self.ceiling)


def resolve_run(
    config: Path | None,
    phases: str | None,
    given: Mapping[str, object],
    index_k_dtype: IndexKDtype = IndexKDtype.FP8_E4M3,
) -> RunSettings:
    """Flag sources (defaults < config < environment) < the command's options.

    ``given`` maps flag names (``page_size``, ``nsa_prefill_cp_mode``, ...) to the command's
    values, None where it leaves a flag alone; ``attn_cp_size`` (``--cp-size``) turns CP on
    for the run. ``phases`` (``--phases``) replaces the enabled set.

    Raises:
        ValueError: a malformed config, environment variable, option or phase list.
    """
    cli = {flag: value for flag, value in given.items() if value is not None}
    if "attn_cp_size" in cli:
        cli["enable_nsa_prefill_context_parallel"] = True
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
