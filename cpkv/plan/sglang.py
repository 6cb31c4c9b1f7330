"""What an SGLang launch command says about a capacity plan: :func:`read_sglang_plan`.

The command is read once, by ``flags.read_sglang`` (SGLang 0.5.23's argparse and resolution
rules), as ``cpkv flags --from-sglang`` reads it; this module only picks the plan's inputs
from the resolved values. A command SGLang would refuse is bad input here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cpkv.plan.kv_bytes import parse_kv_cache_dtype
from cpkv.plan.model_paths import preset_for_model_path
from flags import FlagError, SglangImport, read_sglang

PLAN_DESTS: dict[str, str] = {
    "tp_size": "tp_size",
    "ep_size": "ep_size",
    "mem_fraction_static": "mem_fraction_static",
    "chunked_prefill_size": "chunked_prefill_size",
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "page_size": "page_size",
}
"""SGLang fields a plan reads as they resolve, to the ``PlanInputs`` field each sets."""


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


def read_sglang_plan(args: str, preset: str | None = None) -> SglangPlanArgs:
    """The plan inputs of an SGLang launch command; ``preset`` (``--model``) replaces the
    command's ``--model-path`` for the plan and for SGLang's model rules.

    Raises:
        ValueError: SGLang refuses the command, a value is malformed, or the model path maps
            to no preset (and no ``preset`` is given).
    """
    imported = read_sglang(args, preset)
    if imported.problems:
        reasons = "; ".join(f"{p} [{p.source}]" for p in imported.problems)
        raise FlagError(f"SGLang would refuse this command: {reasons}")
    values = _values(imported, preset)
    notes = list(imported.resolved.notes)
    if imported.sglang.values["dp_size"] > 1:
        dp = imported.sglang.values["dp_size"]
        notes.append(f"dp_size={dp} without attention DP: {dp} replicas, each planned alone")
    read = {*PLAN_DESTS, "kv_cache_dtype"}
    ignored = [o for dest, o in imported.unused.items() if dest not in read]
    return SglangPlanArgs(values, (*ignored, *imported.unused_env), tuple(notes), imported.warnings)


def _values(imported: SglangImport, preset: str | None) -> dict[str, tuple[Any, str]]:
    resolution = imported.sglang
    values: dict[str, tuple[Any, str]] = {}
    if preset is None:
        model_source = imported.source_of("model_path")
        model, dtype = preset_for_model_path(resolution.values["model_path"])
        values |= {"model": (model, model_source), "weight_dtype": (dtype, model_source)}
    for dest, name in PLAN_DESTS.items():
        if dest in resolution.given or dest in resolution.declared:
            values[name] = (resolution.values[dest], imported.source_of(dest))
    attn_dp = resolution.values["attn_dp_size"]
    if attn_dp > 1:
        values["dp_attention"] = (attn_dp, imported.source_of("attn_dp_size"))
    if resolution.cp_size > 1:
        values["cp_size"] = (resolution.cp_size, imported.source_of("attn_cp_size"))
    dtype_source = imported.source_of("kv_cache_dtype")
    if dtype_source != "default":
        kv_dtype = parse_kv_cache_dtype(resolution.values["kv_cache_dtype"])
        values["kv_cache_dtype"] = (kv_dtype, dtype_source)
    return values
