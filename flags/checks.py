"""Start-up checks of flag combinations: every problem, each a stable code plus its values."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flags.model import FLAG_SPECS, PHASE_FLAGS, FlagError, FlagSet
from phases import PHASE_NEEDS, PhaseId, startup_problems

Value = str | int | bool | None

MAX_BATCH_TIMEOUT_S = 86400.0
"""The longest ``--batch-timeout-s``: a day (a collective timeout must fit a timedelta)."""


class ProblemCode(StrEnum):
    """Why a flag set cannot start. Codes are stable: scripts match on them."""

    CP_SIZE_BELOW_ONE = "CP_SIZE_BELOW_ONE"
    """``--attn-cp-size`` is below 1."""
    PAGE_SIZE_BELOW_ONE = "PAGE_SIZE_BELOW_ONE"
    """``--page-size`` is below 1."""
    DECODE_CP_SIZE_BELOW_ONE = "DECODE_CP_SIZE_BELOW_ONE"
    """``--disaggregation-decode-cp-size`` is below 1."""
    CP_MIN_TOKENS_BELOW_ZERO = "CP_MIN_TOKENS_BELOW_ZERO"
    """``--nsa-prefill-cp-min-tokens`` is below 0."""
    MAX_PHASE_OUT_OF_RANGE = "MAX_PHASE_OUT_OF_RANGE"
    """``CPKV_MAX_PHASE`` is set outside 0..5."""
    SHADOW_RATE_OUT_OF_RANGE = "SHADOW_RATE_OUT_OF_RANGE"
    """``--shadow-rate`` is outside 0..1."""
    BATCH_TIMEOUT_OUT_OF_RANGE = "BATCH_TIMEOUT_OUT_OF_RANGE"
    """``--batch-timeout-s`` is not a finite number of seconds above 0 (at most a day)."""
    PD_HOST_INVALID = "PD_HOST_INVALID"
    """``--pd-host`` or ``--pd-local-host`` is empty, holds whitespace, or names every
    interface (``0.0.0.0``, ``::``): peers need one address to reach."""
    PHASE_WITHOUT_CP = "PHASE_WITHOUT_CP"
    """A phase flag is on while ``--enable-nsa-prefill-context-parallel`` is off."""
    NEEDS_DISABLED = "NEEDS_DISABLED"
    """A phase flag is on but the flag of a phase it needs is off."""
    STARTUP_CONTRACT = "STARTUP_CONTRACT"
    """A flagged phase's own start-up contract (``phases``) does not hold for the
    deployment the flags describe (e.g. phase 2 with a CP decode side)."""


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
    in the configuration), and so are the phases' own start-up contracts, against
    :meth:`FlagSet.deployment`: each rule is stated once, in its phase.
    """
    problems = _value_problems(flags) + _combination_problems(flags)
    if not any(p.code in _SIZE_CODES for p in problems):
        problems += _contract_problems(flags)
    return problems


_SIZE_CODES = {
    ProblemCode.CP_MIN_TOKENS_BELOW_ZERO,
    ProblemCode.CP_SIZE_BELOW_ONE,
    ProblemCode.PAGE_SIZE_BELOW_ONE,
    ProblemCode.DECODE_CP_SIZE_BELOW_ONE,
}

FLAG_OF_DEPLOYMENT_FIELD: dict[str, str] = {
    "cp_size": "attn_cp_size",
    "cp_mode": "nsa_prefill_cp_mode",
    "page_size": "page_size",
    "decode_cp_size": "disaggregation_decode_cp_size",
    "pd_backend": "disaggregation_transfer_backend",
}
"""The flag behind each deployment field a phase contract constrains."""


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
    if flags.nsa_prefill_cp_min_tokens < 0:
        name = "nsa_prefill_cp_min_tokens"
        hint = f"set {FLAG_SPECS[name].cli} to 0 (always split) or more"
        code = ProblemCode.CP_MIN_TOKENS_BELOW_ZERO
        problems.append(Problem(code, ((name, flags.nsa_prefill_cp_min_tokens),), hint))
    ceiling = flags.max_phase
    if ceiling is not None and not 0 <= ceiling <= max(PhaseId):
        hint = "set CPKV_MAX_PHASE to 0..5, or unset it for no ceiling"
        code = ProblemCode.MAX_PHASE_OUT_OF_RANGE
        problems.append(Problem(code, (("CPKV_MAX_PHASE", ceiling),), hint))
    if not 0.0 <= flags.shadow_rate <= 1.0:
        hint = "set --shadow-rate to a share of batches in 0..1"
        code = ProblemCode.SHADOW_RATE_OUT_OF_RANGE
        problems.append(Problem(code, (("shadow_rate", str(flags.shadow_rate)),), hint))
    if not 0.0 < flags.batch_timeout_s <= MAX_BATCH_TIMEOUT_S:
        hint = f"set --batch-timeout-s to seconds in (0, {MAX_BATCH_TIMEOUT_S:g}]"
        code = ProblemCode.BATCH_TIMEOUT_OUT_OF_RANGE
        problems.append(Problem(code, (("batch_timeout_s", str(flags.batch_timeout_s)),), hint))
    problems += _host_problems(flags)
    return problems


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*", "[::]"})
"""Addresses that mean every interface: a listener must bind one, and a peer cannot dial them."""


def _host_problems(flags: FlagSet) -> list[Problem]:
    problems = []
    for name in ("pd_host", "pd_local_host"):
        host: str = getattr(flags, name)
        if not host or any(c.isspace() for c in host) or host in WILDCARD_HOSTS:
            hint = f"set {FLAG_SPECS[name].cli} to this machine's address or host name"
            problems.append(Problem(ProblemCode.PD_HOST_INVALID, ((name, repr(host)),), hint))
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
    return problems


def _contract_problems(flags: FlagSet) -> list[Problem]:
    """The flagged phases' start-up contracts, each failure named by its flag."""
    try:
        deploy = flags.deployment()
    except FlagError:
        return []
    problems = []
    for phase, reasons in startup_problems(flags.flagged_phases(), deploy).items():
        for reason in reasons:
            values = tuple(
                (FLAG_OF_DEPLOYMENT_FIELD.get(field, field), _flag_value(flags, field, value))
                for field, value in reason.values
            )
            flag = FLAG_SPECS.get(values[0][0]) if values else None
            change = flag.cli if flag is not None else "the deployment"
            problems.append(
                Problem(
                    ProblemCode.STARTUP_CONTRACT,
                    (("phase", int(phase)), *values),
                    f"phase {int(phase)} {reason.rule}: change {change}, or turn it off",
                    reason.rule,
                )
            )
    return problems


def _flag_value(flags: FlagSet, field: str, value: Value) -> Value:
    """The flag's own value where a contract field is derived (``pd_backend``)."""
    name = FLAG_OF_DEPLOYMENT_FIELD.get(field)
    return getattr(flags, name) if name is not None and hasattr(flags, name) else value
