"""What an SGLang launch command says about a capacity plan: :func:`read_sglang_plan`.

The command is read once, by ``flags.read_sglang`` (SGLang 0.5.23's argparse and resolution
rules), as ``cpkv flags --from-sglang`` reads it; this module only picks the plan's inputs
from the resolved values. A command SGLang would refuse is bad input here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from cpkv.plan.kv_bytes import parse_kv_cache_dtype
from cpkv.plan.model_paths import plan_model
from flags import FlagError, SglangImport, read_sglang
from flags.sglang.memory import H200_MIB

PLAN_DESTS: dict[str, str] = {
    "tp_size": "tp_size",
    "ep_size": "ep_size",
    "page_size": "page_size",
}
"""SGLang fields a plan reads as they resolve, to the ``PlanInputs`` field each sets."""
GIVEN_DESTS: dict[str, str] = {
    "mem_fraction_static": "mem_fraction_static",
    "chunked_prefill_size": "chunked_prefill_size",
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
}
"""SGLang fields a plan reads as the command gives them (what SGLang derives from them comes
through ``sglang_memory``)."""
MEMORY_OPTIONS = {
    "chunked_prefill_size": "--chunked-prefill-size",
    "cuda_graph_max_bs": "--cuda-graph-max-bs-decode",
}
"""``cpkv plan`` options that are SGLang options too, to that option."""


@dataclass(frozen=True, slots=True)
class SglangPlanArgs:
    """Plan inputs read from a launch command, each with the argument that set it."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """``PlanInputs`` field to (value, ``sglang:...``)."""
    ignored: tuple[str, ...] = ()
    """Options neither the plan nor the flags read."""
    notes: tuple[str, ...] = ()
    """Values SGLang resolves that the command does not spell out."""
    warnings: tuple[str, ...] = ()
    """Seed-series names read anyway, deprecated options."""


def read_sglang_plan(
    args: str,
    preset: str | None = None,
    gpu_mem_gib: float | None = None,
    memory_options: dict[str, int] | None = None,
) -> SglangPlanArgs:
    """The plan inputs of an SGLang launch command; ``preset`` (``--model``) replaces the
    command's ``--model-path`` for the plan and for SGLang's model rules. SGLang's memory
    defaults are resolved for a GPU of ``gpu_mem_gib`` (None: an H200).

    Args:
        args: the launch command.
        preset: a cpkv preset to plan instead of the command's model.
        gpu_mem_gib: the GPU's memory; None is an H200's.
        memory_options: plan options that size SGLang's reserve (``chunked_prefill_size``,
            ``cuda_graph_max_bs``); they join the command as its last SGLang options, so
            they win as SGLang's argparse lets the last one win.

    Raises:
        ValueError: SGLang refuses the command, a value is malformed, or the model is one
            cpkv cannot plan (no preset, not MLA, a malformed ``config.json``).
    """
    gpu_mib = H200_MIB if gpu_mem_gib is None else gpu_mem_gib * 1024
    for name, value in (memory_options or {}).items():
        args += f" {MEMORY_OPTIONS[name]} {int(value)}"
    imported = read_sglang(args, preset, gpu_mib)
    if imported.problems:
        reasons = "; ".join(f"{p} [{p.source}]" for p in imported.problems)
        raise FlagError(f"SGLang would refuse this command: {reasons}")
    values = _values(imported, preset)
    notes = list(imported.resolved.notes)
    if imported.sglang.values["dp_size"] > 1:
        dp = imported.sglang.values["dp_size"]
        notes.append(f"dp_size={dp} without attention DP: {dp} replicas, each planned alone")
    read = {*PLAN_DESTS, *GIVEN_DESTS, "kv_cache_dtype"}
    ignored = [o for dest, o in imported.unused.items() if dest not in read]
    return SglangPlanArgs(values, (*ignored, *imported.unused_env), tuple(notes), imported.warnings)


def _values(imported: SglangImport, preset: str | None) -> dict[str, tuple[Any, str]]:
    resolution = imported.sglang
    values: dict[str, tuple[Any, str]] = {}
    if preset is None:
        values |= _model(imported)
    for dest, name in PLAN_DESTS.items():
        if dest in resolution.given or dest in resolution.declared:
            values[name] = (resolution.values[dest], imported.source_of(dest))
    for dest, name in GIVEN_DESTS.items():
        if dest in resolution.given:
            values[name] = (resolution.parsed_values[dest], imported.source_of(dest))
    if resolution.memory is not None:
        # NOTE: the server runs the chunk as resolved (divided under attention DP, rounded
        # for KV sharding); the reserve was sized before both, as SGLang sizes it.
        memory = replace(
            resolution.memory,
            chunked_prefill_size=resolution.values["chunked_prefill_size"],
            mem_fraction_static=resolution.values["mem_fraction_static"],
        )
        values["sglang_memory"] = (memory, imported.source_of("mem_fraction_static"))
    attn_dp = resolution.values["attn_dp_size"]
    if attn_dp > 1:
        values["dp_attention"] = (attn_dp, imported.source_of("attn_dp_size"))
    if resolution.cp_size > 1:
        values["cp_size"] = (resolution.cp_size, imported.source_of("attn_cp_size"))
    elif resolution.values["attn_cp_size"] > 1:
        attn_cp = resolution.values["attn_cp_size"]
        values["attn_cp_size"] = (attn_cp, imported.source_of("attn_cp_size"))
    dtype_source = imported.source_of("kv_cache_dtype")
    if dtype_source != "default":
        kv_dtype = parse_kv_cache_dtype(resolution.values["kv_cache_dtype"])
        values["kv_cache_dtype"] = (kv_dtype, dtype_source)
    return values


def _model(imported: SglangImport) -> dict[str, tuple[Any, str]]:
    """The model a command plans: its folder's ``config.json``, else its name's preset.

    Raises:
        ValueError: a model cpkv cannot shard (not MLA) or cannot plan.
    """
    model = imported.sglang.model
    found = plan_model(imported.sglang.values["model_path"], model)
    source = imported.source_of("model_path")
    dims_source = source if model is None else f"config:{model.config_path}"
    values = {"model": (found["model"], source)}
    values["weight_dtype"] = (found["model_weight_dtype"], dims_source)
    if "model_dims" in found:
        values["model_dims"] = (found["model_dims"], dims_source)
    return values
