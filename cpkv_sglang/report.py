"""What the plugin tells the server log at start-up: the one line naming the hooks and the
phases on (:func:`startup_line`), and ``cpkv phases`` as SGLang runs them
(:func:`phase_lines`), with the plugin's own refusals (:func:`plugin_refusals`)."""

from __future__ import annotations

from cpkv_sglang.targets import Hook
from flags import PHASE_FIELDS, FlagSet, ResolvedFlags
from flags.sglang.server_args import SERVER_ARGS_SOURCE
from phases import PhaseId

__all__ = ["ENGINE_ONLY", "phase_lines", "plugin_refusals", "startup_line"]

ENGINE_ONLY: dict[PhaseId, str] = {
    PhaseId.CURRENT_REUSE: (
        "runs on cpkv's engine only as a flag: SGLang's KV sharding already stages the "
        "whole current chunk, and its kernels read it from the scratch (set_mla_kv_buffer, "
        "sglang/srt/mem_cache/page_interleave_pool.py)"
    ),
    PhaseId.PAGE_ALIGNED_SPLIT: (
        "runs on cpkv's engine only: SGLang 0.5.23 hard-wires the token interleave in about ten "
        "functions (cp_interleave_input_ids, shard_per_request and its CUDA kernel "
        "dsa_cp_interleave_q_seqs, the indexer overlap, the MoE transport, the "
        "breakable-CUDA-graph inputs); changing it takes patches, not hooks"
    ),
    PhaseId.COMPUTE_OWNER_WRITE: (
        "runs on cpkv's engine only: it needs phase 4's page-aligned split, which SGLang's token "
        "interleave cannot take through hooks"
    ),
}
"""The phases the plugin does not run in SGLang's code path, and why."""

PHASE_NAMES = {
    PhaseId.CURRENT_REUSE: "current reuse",
    PhaseId.PAGE_ALIGNED_SPLIT: "page-aligned split",
    PhaseId.COMPUTE_OWNER_WRITE: "compute-owner write",
}

_SHARDING = (
    "SGLang's own --enable-kv-cache-sharding (PageInterleavePlacement: owner = page % N, "
    "sglang/srt/mem_cache/page_interleave.py); the plugin does not re-implement it"
)


def plugin_refusals(settings: FlagSet, flags: ResolvedFlags) -> list[str]:
    """What the plugin cannot do for these settings (``settings``: cpkv's own sources;
    ``flags``: overlaid by the server), each with its fix."""
    own = flags.flags
    refusals = [
        f"phase {int(p)} is enabled ({flags.sources[PHASE_FIELDS[p]]}), but it "
        f"{ENGINE_ONLY[p]}; turn it off (cpkv disable {int(p)})"
        for p in sorted(own.flagged_phases())
        if p in ENGINE_ONLY
    ]
    sharded_by_server = flags.sources["enable_nsa_prefill_cp_shared_kv"].startswith(
        SERVER_ARGS_SOURCE
    )
    if settings.enable_nsa_prefill_cp_shared_kv and not (
        own.enable_nsa_prefill_cp_shared_kv and sharded_by_server
    ):
        refusals.append(
            "phase 2 is enabled in cpkv's settings, but here it is SGLang's own KV sharding "
            "and this server runs without it: launch SGLang with --enable-kv-cache-sharding "
            "(over prefill CP), or turn phase 2 off"
        )
    if str(own.cp_split_gate) != "sglang":
        refusals.append(
            f"--cp-split-gate {own.cp_split_gate}: in SGLang the plugin keeps SGLang's own "
            "split gate (it can only run more batches unsplit); set it back to sglang"
        )
    return refusals


def startup_line(hooks: tuple[Hook, ...], flags: ResolvedFlags) -> str:
    """``cpkv plugin on sglang 0.5.23: hooks A, B; phases on: 1 (narrow output); ...``."""
    own = flags.flags
    on = []
    if PhaseId.NARROW_OUTPUT in own.enabled_phases():
        on.append("1 (narrow output)")
    if own.enable_nsa_prefill_cp_shared_kv and own.enable_nsa_prefill_context_parallel:
        on.append("2 (SGLang's KV sharding)")
    names = ", ".join(hook.target.removeprefix("sglang.srt.") for hook in hooks)
    extra = [f"shadow rate {own.shadow_rate:g}"] if own.shadow_rate else []
    if own.nsa_prefill_cp_min_tokens:
        extra.append(f"CP off below {own.nsa_prefill_cp_min_tokens} tokens")
    cp = "CP off"
    if own.enable_nsa_prefill_context_parallel:
        cp = f"cp {own.attn_cp_size} {own.nsa_prefill_cp_mode}"
    tail = "; ".join([cp, *extra])
    return f"cpkv plugin: hooks {names}; phases on: {', '.join(on) or 'none'}; {tail}"


def phase_lines(flags: ResolvedFlags) -> list[str]:
    """``cpkv phases`` as this server runs them, one line a phase."""
    own = flags.flags
    enabled = own.enabled_phases()
    state = "on" if PhaseId.NARROW_OUTPUT in enabled else "off"
    lines = [
        f"phase 1 narrow output: {state} (cpkv's hooks on SGLang's tail gather)",
        f"phase 2 sharded KV: {'on' if PhaseId.SHARDED_KV in enabled else 'off'}: {_SHARDING}",
    ]
    lines += [f"phase {int(p)} {PHASE_NAMES[p]}: {why}" for p, why in ENGINE_ONLY.items()]
    return lines
