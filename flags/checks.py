"""Start-up checks of flag combinations: every problem, each a stable code plus its values."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cpkv_core.config import CpMode, DisaggregationMode, TransferBackend
from flags.model import FLAG_SPECS, PHASE_FLAGS, FlagError, FlagSet
from phases import PHASE_NEEDS, PhaseId, startup_problems

Value = str | int | bool | None


class ProblemCode(StrEnum):
    """Why a flag set cannot start. Codes are stable: scripts match on them."""

    CP_SIZE_BELOW_ONE = "CP_SIZE_BELOW_ONE"
    """``--attn-cp-size`` is below 1."""
    PAGE_SIZE_BELOW_ONE = "PAGE_SIZE_BELOW_ONE"
    """``--page-size`` is below 1."""
    DECODE_CP_SIZE_BELOW_ONE = "DECODE_CP_SIZE_BELOW_ONE"
    """``--disaggregation-decode-cp-size`` is below 1."""
    MAX_PHASE_OUT_OF_RANGE = "MAX_PHASE_OUT_OF_RANGE"
    """``CPKV_MAX_PHASE`` is set outside 0..5."""
    PHASE_WITHOUT_CP = "PHASE_WITHOUT_CP"
    """A phase flag is on while ``--enable-nsa-prefill-context-parallel`` is off."""
    NEEDS_DISABLED = "NEEDS_DISABLED"
    """A phase flag is on but the flag of a phase it needs is off."""
    PAGE_ALIGNED_WITH_ROUND_ROBIN = "PAGE_ALIGNED_WITH_ROUND_ROBIN"
    """Phase 4 cuts the zigzag split; round-robin-split has no segments to align."""
    SHARED_KV_WITH_CP_DECODE = "SHARED_KV_WITH_CP_DECODE"
    """Phase 2 sends owned pages to a non-CP decode side; a CP decode side is not supported."""
    SHARED_KV_WITH_BACKEND = "SHARED_KV_WITH_BACKEND"
    """Phase 2 under PD needs owned-page transfer, which only the Mooncake backend has."""
    STARTUP_CONTRACT = "STARTUP_CONTRACT"
    """A phase's own start-up contract (``phases``) does not hold for the deployment."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One start-up problem: ``CODE key=value ...`` and, for phase contracts, their text."""

    code: ProblemCode
    values: tuple[tuple[str, Value], ...]
    """The values that decided it, in print order."""
    hint: str = ""
    """How to fix it; shown to people, not part of the stable text."""
    detail: str = ""
    """Free text appended after the values (a phase contract's own reason)."""

    def __str__(self) -> str:
        parts = [str(self.code), *(f"{k}={_show(v)}" for k, v in self.values)]
        if self.detail:
            parts.append(self.detail)
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """``{"code", "values", "text", "hint"}``."""
        return {
            "code": str(self.code),
            "values": {k: _jsonable(v) for k, v in self.values},
            "text": str(self),
            "hint": self.hint,
        }


def _show(value: Value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _jsonable(value: Value) -> Value:
    return str(value) if isinstance(value, StrEnum) else value


def check_flags(flags: FlagSet) -> list[Problem]:
    """Every start-up problem of ``flags``: bad values, bad combinations, phase contracts.

    Combinations are checked over the flagged phases (the ceiling never hides a problem
    in the configuration); the phases' own start-up contracts are checked for the phases
    the gate would be handed, against :meth:`FlagSet.deployment`.
    """
    problems = _value_problems(flags) + _combination_problems(flags)
    if not any(p.code in _SIZE_CODES for p in problems):
        # NOTE: a named combination problem (e.g. SHARED_KV_WITH_CP_DECODE) restates the
        # phase's own contract in flag terms; report each cause once, by its flag name.
        named = {dict(p.values).get("phase") for p in problems}
        problems += [p for p in _contract_problems(flags) if dict(p.values)["phase"] not in named]
    return problems


_SIZE_CODES = {
    ProblemCode.CP_SIZE_BELOW_ONE,
    ProblemCode.PAGE_SIZE_BELOW_ONE,
    ProblemCode.DECODE_CP_SIZE_BELOW_ONE,
}


def _value_problems(flags: FlagSet) -> list[Problem]:
    problems = []
    sizes = (
        (ProblemCode.CP_SIZE_BELOW_ONE, "attn_cp_size"),
        (ProblemCode.PAGE_SIZE_BELOW_ONE, "page_size"),
        (ProblemCode.DECODE_CP_SIZE_BELOW_ONE, "disaggregation_decode_cp_size"),
    )
    for code, name in sizes:
        value = getattr(flags, name)
        if value < 1:
            hint = f"set {FLAG_SPECS[name].cli} to 1 or more"
            problems.append(Problem(code, ((name, value),), hint))
    ceiling = flags.max_phase
    if ceiling is not None and not 0 <= ceiling <= max(PhaseId):
        hint = "set CPKV_MAX_PHASE to 0..5, or unset it for no ceiling"
        code = ProblemCode.MAX_PHASE_OUT_OF_RANGE
        problems.append(Problem(code, (("CPKV_MAX_PHASE", ceiling),), hint))
    return problems


def _combination_problems(flags: FlagSet) -> list[Problem]:
    flagged = flags.flagged_phases()
    problems = []
    if not flags.enable_nsa_prefill_context_parallel:
        hint = "turn on --enable-nsa-prefill-context-parallel, or turn the phase off"
        problems += [
            Problem(ProblemCode.PHASE_WITHOUT_CP, (("phase", int(p)),), hint)
            for p in sorted(flagged)
        ]
    for phase in sorted(flagged):
        problems += [
            Problem(
                ProblemCode.NEEDS_DISABLED,
                (("phase", int(phase)), ("needs", int(need))),
                f"turn on {PHASE_FLAGS[need]} too (cpkv enable {int(phase)} --with-needs)",
            )
            for need in PHASE_NEEDS[phase]
            if need not in flagged
        ]
    return problems + _layout_problems(flags, flagged)


def _layout_problems(flags: FlagSet, flagged: frozenset[PhaseId]) -> list[Problem]:
    problems = []
    mode = flags.nsa_prefill_cp_mode
    if PhaseId.PAGE_ALIGNED_SPLIT in flagged and mode is CpMode.ROUND_ROBIN_SPLIT:
        problems.append(
            Problem(
                ProblemCode.PAGE_ALIGNED_WITH_ROUND_ROBIN,
                (("phase", 4), ("nsa_prefill_cp_mode", str(mode))),
                "use --nsa-prefill-cp-mode in-seq-split, or turn phase 4 off",
            )
        )
    if PhaseId.SHARDED_KV not in flagged:
        return problems
    decode_cp = flags.disaggregation_decode_cp_size
    if decode_cp > 1:
        problems.append(
            Problem(
                ProblemCode.SHARED_KV_WITH_CP_DECODE,
                (("phase", 2), ("disaggregation_decode_cp_size", decode_cp)),
                "sharded KV is sent to a non-CP decode side only; turn phase 2 off",
            )
        )
    backend = flags.disaggregation_transfer_backend
    pd = flags.disaggregation_mode is not DisaggregationMode.NULL
    if pd and backend is not TransferBackend.MOONCAKE:
        problems.append(
            Problem(
                ProblemCode.SHARED_KV_WITH_BACKEND,
                (("phase", 2), ("disaggregation_transfer_backend", str(backend))),
                "owned-page transfer needs --disaggregation-transfer-backend mooncake",
            )
        )
    return problems


def _contract_problems(flags: FlagSet) -> list[Problem]:
    try:
        deploy = flags.deployment()
    except FlagError:
        return []
    code = str(ProblemCode.STARTUP_CONTRACT)
    return [
        Problem(
            ProblemCode.STARTUP_CONTRACT,
            (("phase", int(phase)),),
            f"change the deployment or turn phase {int(phase)} off (cpkv phases lists contracts)",
            text.removeprefix(code).strip(),
        )
        for phase, texts in startup_problems(flags.enabled_phases(), deploy).items()
        for text in texts
    ]
