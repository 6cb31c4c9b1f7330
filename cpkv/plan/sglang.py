"""What an SGLang launch command says about a capacity plan: :func:`read_sglang_plan`.

The CP size and page size come from cpkv's flag reader (``flags.read_sglang``: the CP
switches, ``--attn-cp-size``, ``--page-size``); the model, the parallel sizes, the memory
fraction, the KV dtype and what SGLang's default reserve depends on are read here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from cpkv.plan.kv_bytes import parse_kv_cache_dtype
from cpkv.plan.model_paths import preset_for_model_path
from flags import FlagError, FlagSet, read_sglang

VALUED_ARGS: dict[str, str] = {
    "--model-path": "model_path",
    "--model": "model_path",
    "--tp": "tp_size",
    "--tp-size": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--dp": "dp",
    "--dp-size": "dp",
    "--data-parallel-size": "dp",
    "--ep": "ep_size",
    "--ep-size": "ep_size",
    "--expert-parallel-size": "ep_size",
    "--moe-a2a-backend": "moe_a2a_backend",
    "--mem-fraction-static": "mem_fraction_static",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--chunked-prefill-size": "chunked_prefill_size",
    "--cuda-graph-max-bs": "cuda_graph_max_bs",
}
"""SGLang arguments with a value that a plan reads, and what each sets."""

_CONVERT: dict[str, Any] = {
    "tp_size": int,
    "dp": int,
    "ep_size": int,
    "mem_fraction_static": float,
    "kv_cache_dtype": parse_kv_cache_dtype,
    "chunked_prefill_size": int,
    "cuda_graph_max_bs": int,
}


@dataclass(frozen=True, slots=True)
class SglangPlanArgs:
    """Plan inputs read from a launch command, each with the argument that set it."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """``PlanInputs`` field to (value, ``sglang:ARG``)."""
    ignored: tuple[str, ...] = ()
    """Tokens neither the plan nor the flags read."""
    notes: tuple[str, ...] = ()
    """Values SGLang infers that the command does not spell out."""


def read_sglang_plan(args: str) -> SglangPlanArgs:
    """The plan inputs of an SGLang launch command.

    Raises:
        ValueError: a value is malformed, or the model path maps to no preset.
    """
    imported = read_sglang(args)
    tokens = shlex.split(args)
    raw, used = _scan(tokens)
    values: dict[str, tuple[Any, str]] = {}
    notes: list[str] = []
    for name, (text, source) in raw.items():
        if name == "model_path":
            preset, dtype = preset_for_model_path(text)
            values["model"] = (preset, source)
            values["weight_dtype"] = (dtype, source)
        elif name in _CONVERT:
            values[name] = (_convert(name, text, source), source)
    _parallel(raw, values, notes)
    _cp_and_page(imported.resolved.flags, imported.resolved.sources, values, notes)
    ignored = tuple(
        token
        for token, at in zip(imported.ignored, imported.ignored_at, strict=True)
        if at not in used
    )
    return SglangPlanArgs(values, ignored, tuple(notes))


def _scan(tokens: list[str]) -> tuple[dict[str, tuple[str, str]], set[int]]:
    """``{name: (text, "sglang:ARG")}`` and the positions read, ``--enable-dp-attention``
    included."""
    raw: dict[str, tuple[str, str]] = {}
    used: set[int] = set()
    i = 0
    while i < len(tokens):
        arg, eq, inline = tokens[i].partition("=")
        if arg == "--enable-dp-attention":
            raw["dp_attention"] = (inline if eq else "true", f"sglang:{arg}")
            used.add(i)
        elif arg in VALUED_ARGS:
            if not eq and i + 1 >= len(tokens):
                raise FlagError(f"--from-sglang: {arg} needs a value")
            raw[VALUED_ARGS[arg]] = (inline if eq else tokens[i + 1], f"sglang:{arg}")
            used.update((i,) if eq else (i, i + 1))
            i += 0 if eq else 1
        i += 1
    return raw, used


def _convert(name: str, text: str, source: str) -> Any:
    try:
        return _CONVERT[name](text)
    except ValueError as exc:
        raise FlagError(f"--from-sglang: {source.removeprefix('sglang:')}: {exc}") from None


def _parallel(
    raw: dict[str, tuple[str, str]], values: dict[str, tuple[Any, str]], notes: list[str]
) -> None:
    """Attention DP from ``--dp`` under ``--enable-dp-attention``; EP from an a2a backend."""
    dp_on = raw.get("dp_attention", ("false", ""))[0].lower() in ("true", "1", "yes", "on")
    dp, dp_source = values.pop("dp", (1, ""))
    if dp_on:
        values["dp_attention"] = (dp, dp_source or raw["dp_attention"][1])
    elif dp > 1:
        notes.append(f"dp={dp} without --enable-dp-attention: {dp} replicas, each planned alone")
    backend = raw.get("moe_a2a_backend", ("none", ""))
    if backend[0] != "none" and "ep_size" not in values and "tp_size" in values:
        values["ep_size"] = (values["tp_size"][0], backend[1])
        notes.append(f"ep_size=tp_size: SGLang sets it for --moe-a2a-backend {backend[0]}")


def _cp_and_page(
    flags: FlagSet, sources: dict[str, str], values: dict[str, tuple[Any, str]], notes: list[str]
) -> None:
    """CP size and page size from the flag reader; SGLang's automatic CP size otherwise."""
    if sources.get("page_size", "default") != "default":
        values["page_size"] = (flags.page_size, sources["page_size"])
    if not flags.enable_nsa_prefill_context_parallel:
        return
    if sources.get("attn_cp_size", "default") != "default":
        values["cp_size"] = (flags.attn_cp_size, sources["attn_cp_size"])
        return
    tp = values.get("tp_size", (1, ""))[0]
    dp = values.get("dp_attention", (1, ""))[0]
    values["cp_size"] = (max(tp // dp, 1), "sglang:--tp")
    notes.append(
        f"cp_size={max(tp // dp, 1)} inferred as tp_size // dp (SGLang's automatic "
        f"--attn-cp-size for DeepSeek-family models with prefill CP on)"
    )
