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
    deployment the flags describe (e.g. phase 2 under PD with a transfer backend other than
    Mooncake)."""
    SGLANG_ATTN_DP = "SGLANG_ATTN_DP"
    """SGLang 0.5.23 refuses the attention-DP layout (``--attn-dp-size``, ``--dp-size``)."""
    SGLANG_CP_STRATEGY_UNSET = "SGLANG_CP_STRATEGY_UNSET"
    """``--enable-prefill-cp`` without ``--cp-strategy``."""
    SGLANG_CP_STRATEGY_UNSUPPORTED = "SGLANG_CP_STRATEGY_UNSUPPORTED"
    """The model does not run this CP strategy (DeepSeek-V3.2 with zigzag), or no prefill
    CP at all (HYV4)."""
    SGLANG_CP_TP_ABOVE_8 = "SGLANG_CP_TP_ABOVE_8"
    """DSA prefill CP with ``--tp-size`` above 8 (one machine only)."""
    SGLANG_CP_ON_DECODE = "SGLANG_CP_ON_DECODE"
    """Prefill CP on a PD decode worker."""
    SGLANG_CP_SIZE_INDIVISIBLE = "SGLANG_CP_SIZE_INDIVISIBLE"
    """``--tp-size`` is not a multiple of the CP size (times the attention-DP size)."""
    SGLANG_MOE_DP = "SGLANG_MOE_DP"
    """``--moe-dp-size`` does not fit the TP, EP or CP sizes."""
    SGLANG_DCP = "SGLANG_DCP"
    """Decode context parallelism (``--dcp-size``) below 1, with prefill CP, with its
    options but no DCP, for a DSA model with PD, HiCache or EAGLE top-k above 1, or for
    HYV4 at all."""
    SGLANG_CACHE = "SGLANG_CACHE"
    """Radix-cache options SGLang refuses together (HiCache without the radix cache)."""
    SGLANG_ATTENTION_BACKEND = "SGLANG_ATTENTION_BACKEND"
    """An attention backend this platform does not run (TRT-LLM or CuteDSL MLA below
    Blackwell)."""
    SGLANG_PD_TRANSFER_BACKEND = "SGLANG_PD_TRANSFER_BACKEND"
    """The PD transfer backend cannot serve this PD role."""
    SGLANG_DSA_KV_CACHE_DTYPE = "SGLANG_DSA_KV_CACHE_DTYPE"
    """A DSA model with a KV-cache dtype other than bf16 or fp8_e4m3 (bf16 alone with
    learnable attention sinks)."""
    SGLANG_DSA_BACKEND = "SGLANG_DSA_BACKEND"
    """A DSA attention kernel this platform or KV dtype does not run."""
    SGLANG_DSA_CACHE_LAYER_SPLIT = "SGLANG_DSA_CACHE_LAYER_SPLIT"
    """``--enable-dsa-cache-layer-split`` outside a PD prefill worker with interleave CP over
    Mooncake."""
    SGLANG_LANGUAGE_MODEL_ONLY = "SGLANG_LANGUAGE_MODEL_ONLY"
    """``--language-model-only`` with an encoder option, on a PD worker, or for a model
    SGLang does not serve text-only."""
    SGLANG_ENCODER_DISAGGREGATION = "SGLANG_ENCODER_DISAGGREGATION"
    """An encoder-disaggregation role (``--encoder-only``, ``--language-only``) SGLang
    refuses: both at once, an encoder under PD, or a model whose encoder it cannot serve
    apart."""
    SGLANG_QUANTIZATION = "SGLANG_QUANTIZATION"
    """A ``--quantization`` the checkpoint's own method does not allow, or one this
    platform does not run (``nvfp4_online`` below Blackwell)."""
    SGLANG_MODEL_CONFIG = "SGLANG_MODEL_CONFIG"
    """The command does not fit its checkpoint's config: a ``--context-length`` above the
    config's, a DSA config without ``index_head_dim``, two-batch overlap with DSA top-k
    sharing."""
    SGLANG_EXPERT_PARALLEL = "SGLANG_EXPERT_PARALLEL"
    """EPLB without expert parallelism, or a per-rank expert dispatch without an MoE
    all-to-all backend."""
    SGLANG_LM_HEAD = "SGLANG_LM_HEAD"
    """A DP or TP-all-to-all LM head without the attention-DP layout it needs."""
    SGLANG_KV_SHARDING_PD_PREFILL_ONLY = "SGLANG_KV_SHARDING_PD_PREFILL_ONLY"
    """``--enable-kv-cache-sharding`` on anything but a PD prefill worker."""
    SGLANG_KV_SHARDING_DSA_CP = "SGLANG_KV_SHARDING_DSA_CP"
    """DSA KV sharding without CUDA interleave prefill CP > 1 and PP 1."""
    SGLANG_KV_SHARDING_DSA_KERNELS = "SGLANG_KV_SHARDING_DSA_KERNELS"
    """DSA KV sharding without TRT-LLM DSA kernels, fp8_e4m3 KV and page 64."""
    SGLANG_KV_SHARDING_DSA_TRANSFER = "SGLANG_KV_SHARDING_DSA_TRANSFER"
    """DSA KV sharding without Mooncake, an uncompressed index_kpool=1, or with the DSA
    cache layer split."""
    SGLANG_KV_SHARDING_ATTENTION_BACKEND = "SGLANG_KV_SHARDING_ATTENTION_BACKEND"
    """KV sharding with an attention backend that does not shard."""
    SGLANG_KV_SHARDING_TRANSFER_BACKEND = "SGLANG_KV_SHARDING_TRANSFER_BACKEND"
    """KV sharding with a transfer backend other than Mooncake or NIXL."""
    SGLANG_KV_SHARDING_LAYOUT = "SGLANG_KV_SHARDING_LAYOUT"
    """KV sharding without a group to shard over, a real page size or chunked prefill."""
    SGLANG_KV_SHARDING_FEATURE = "SGLANG_KV_SHARDING_FEATURE"
    """KV sharding with a feature it does not support (speculative decoding other than GLM
    NextN EAGLE topk 1, HiCache storage, LMCache, HiSparse, two-batch overlap, ...)."""


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
    source: str = ""
    """Where the rule lives when it is not cpkv's own: ``sglang 0.5.23 FILE``."""

    def __str__(self) -> str:
        parts = [str(self.code), *(f"{k}={_show(v)}" for k, v in self.values)]
        if self.detail:
            parts.append(self.detail)
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """``{"code", "values", "text", "hint", "source"}``; ``source`` is ``cpkv`` for
        cpkv's own rules."""
        return {
            "code": str(self.code),
            "values": {k: _jsonable(v) for k, v in self.values},
            "text": str(self),
            "hint": self.hint,
            "source": self.source or "cpkv",
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
