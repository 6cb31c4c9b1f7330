"""``cpkv plan``: weights, KV pool and token capacity per rank; :func:`register` adds it.

Values come from defaults < an SGLang launch command (``--from-sglang``) < the command's own
options, and the JSON document says where each came from.

Exit codes: 0 ok; 2 bad input (unknown model or model path, an option out of range, sizes
SGLang would refuse, weights that do not fit, or a pool that does not hold one page).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cpkv.commands.options import JsonOpt, out_option, print_written
from cpkv.common.console import BadInput, bad_input_exits, emit, out
from cpkv.plan.capacity import plan_capacity
from cpkv.plan.inputs import PlanInputs
from cpkv.plan.kv_bytes import parse_kv_cache_dtype
from cpkv.plan.memory_budget import MIB_PER_GIB
from cpkv.plan.model_paths import plan_model
from cpkv.plan.sglang import MEMORY_OPTIONS, SglangPlanArgs, read_sglang_plan
from cpkv.render.plan import render_plan
from cpkv_core.config import MaterializeMode, WeightDtype
from cpkv_core.mla_presets import PLAN_PRESETS
from flags.sglang.memory import H200_MIB
from flags.sglang.models import sglang_model

MODEL_CHOICES = "|".join(PLAN_PRESETS)

IntOpt = int | None
FloatOpt = float | None

GpuMemOpt = Annotated[
    float | None,
    typer.Option(
        "--gpu-mem-gib",
        help="GPU memory per rank, in GiB (default: an H200 as SGLang reads it, 143,771 MiB).",
    ),
]
PlanModelOpt = Annotated[
    str | None, typer.Option("--model", help=f"Model preset: {MODEL_CHOICES}.")
]
ModelPathOpt = Annotated[
    str | None,
    typer.Option("--model-path", help="SGLang's --model-path, e.g. deepseek-ai/DeepSeek-V3.2."),
]
FromSglangOpt = Annotated[
    str | None,
    typer.Option(
        "--from-sglang",
        help="Read model, sizes, memory fraction, KV dtype from "
        "an SGLang launch command; the options below override it.",
    ),
]
PlanCpSizeOpt = Annotated[IntOpt, typer.Option("--cp-size", help="CP ranks (default: 1).")]
TpSizeOpt = Annotated[
    IntOpt, typer.Option("--tp-size", help="Ranks of the model instance (default: dp x cp).")
]
EpSizeOpt = Annotated[IntOpt, typer.Option("--ep-size", help="Expert-parallel ranks (default: 1).")]
DpAttentionOpt = Annotated[
    IntOpt, typer.Option("--dp-attention", help="Attention-DP groups; 1 means off (default: 1).")
]
MemFractionOpt = Annotated[
    FloatOpt,
    typer.Option(
        "--mem-fraction-static",
        help="SGLang's share of GPU memory for weights and KV (default: as SGLang derives it).",
    ),
]
ReserveGibOpt = Annotated[
    FloatOpt,
    typer.Option(
        "--reserve-gib",
        help="GiB for activations and CUDA graphs; sets the fraction to 1 - reserve/gpu.",
    ),
]
ChunkedPrefillOpt = Annotated[
    IntOpt, typer.Option("--chunked-prefill-size", help="Sizes SGLang's default reserve.")
]
CudaGraphBsOpt = Annotated[
    IntOpt, typer.Option("--cuda-graph-max-bs", help="Sizes SGLang's default reserve.")
]
KvCacheDtypeOpt = Annotated[
    str | None,
    typer.Option("--kv-cache-dtype", help="auto|bf16|fp8_e4m3 (default: auto = bf16)."),
]
WeightDtypeOpt = Annotated[
    WeightDtype | None,
    typer.Option("--weight-dtype", help="Linear-layer weights (default: the checkpoint's)."),
]
PlanPageSizeOpt = Annotated[
    IntOpt, typer.Option("--page-size", help="Tokens per page (default: 64).")
]
MaxViewTokensOpt = Annotated[
    IntOpt,
    typer.Option(
        "--max-view-tokens",
        help="Largest view one batch reads at level >= 2; sizes the scratch (default: 131072).",
    ),
]
PlanMaterializeOpt = Annotated[
    MaterializeMode | None,
    typer.Option(
        "--materialize",
        help="How level >= 2 builds its view: gather (send slots + padded view) or "
        "peer-read (the view alone). Default: gather.",
    ),
]
PlanPrefetchOpt = Annotated[
    bool | None,
    typer.Option(
        "--materialize-prefetch",
        help="Count a second view buffer: layer l+1's view is fetched while layer l "
        "computes. Default: off.",
    ),
]
PlanOutOpt = Annotated[
    Path | None, out_option("plan.json, capacity.json (cp 1-8) and capacity.png")
]


def plan_command(
    gpu_mem_gib: GpuMemOpt = None,
    model_name: PlanModelOpt = None,
    model_path: ModelPathOpt = None,
    from_sglang: FromSglangOpt = None,
    cp_size: PlanCpSizeOpt = None,
    tp_size: TpSizeOpt = None,
    ep_size: EpSizeOpt = None,
    dp_attention: DpAttentionOpt = None,
    mem_fraction_static: MemFractionOpt = None,
    reserve_gib: ReserveGibOpt = None,
    chunked_prefill_size: ChunkedPrefillOpt = None,
    cuda_graph_max_bs: CudaGraphBsOpt = None,
    kv_cache_dtype: KvCacheDtypeOpt = None,
    weight_dtype: WeightDtypeOpt = None,
    page_size: PlanPageSizeOpt = None,
    max_view_tokens: MaxViewTokensOpt = None,
    materialize: PlanMaterializeOpt = None,
    materialize_prefetch: PlanPrefetchOpt = None,
    as_json: JsonOpt = False,
    out_dir: PlanOutOpt = None,
) -> None:
    """Weights, KV pool and token capacity per rank and per CP group: level 0 (replicated
    KV) vs levels >= 2 (sharded KV, materialization scratch counted)."""
    cli: dict[str, Any] = {
        "gpu_mem_gib": H200_MIB / MIB_PER_GIB if gpu_mem_gib is None else gpu_mem_gib,
        "cp_size": cp_size,
        "tp_size": tp_size,
        "ep_size": ep_size,
        "dp_attention": dp_attention,
        "mem_fraction_static": mem_fraction_static,
        "reserve_gib": reserve_gib,
        "chunked_prefill_size": chunked_prefill_size,
        "cuda_graph_max_bs": cuda_graph_max_bs,
        "weight_dtype": weight_dtype,
        "page_size": page_size,
        "max_view_tokens": max_view_tokens,
        "materialize": materialize,
        "materialize_prefetch": materialize_prefetch,
    }
    with bad_input_exits():
        cli |= _model_options(model_name, model_path, kv_cache_dtype)
        preset = cli["model"]
        memory = {k: cli[k] for k in MEMORY_OPTIONS if cli[k] is not None}
        imported = (
            read_sglang_plan(from_sglang, preset, cli["gpu_mem_gib"], memory)
            if from_sglang is not None
            else None
        )
        values = _merge(imported, {k: v for k, v in cli.items() if v is not None})
        inputs = PlanInputs(**{name: value for name, (value, _) in values.items()})
        plan = plan_capacity(inputs)
    document = plan.to_json() | {"sources": _sources(values)}
    if imported is not None:
        document |= {
            "ignored_args": list(imported.ignored),
            "notes": list(imported.notes),
            "warnings": list(imported.warnings),
        }
    emit(as_json, document, lambda: render_plan(out, plan, document))
    if out_dir is not None:
        # NOTE: matplotlib loads only when figures are asked for.
        from cpkv.plots import write_outputs
        from cpkv.plots.capacity import capacity_sweep, plot_capacity

        documents = {"plan": document, "capacity": capacity_sweep(inputs)}
        print_written(write_outputs(out_dir, "plan", documents, [("capacity", plot_capacity)]))


def _model_options(
    model_name: str | None, model_path: str | None, kv_cache_dtype: str | None
) -> dict[str, Any]:
    if model_name is not None and model_path is not None:
        raise BadInput("give --model or --model-path, not both")
    options: dict[str, Any] = {"model": model_name}
    if model_path is not None:
        options |= plan_model(model_path, sglang_model(model_path))
    if kv_cache_dtype is not None:
        options["kv_cache_dtype"] = parse_kv_cache_dtype(kv_cache_dtype)
    return options


def _merge(imported: SglangPlanArgs | None, cli: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """defaults < the SGLang command < the command line; ``{field: (value, source)}``."""
    values: dict[str, tuple[Any, str]] = dict(imported.values) if imported is not None else {}
    path_dtype = cli.pop("model_weight_dtype", None)
    if "model_dims" in cli:
        values["model_dims"] = (cli.pop("model_dims"), "cli:--model-path")
    if path_dtype is not None and "weight_dtype" not in cli:
        values["weight_dtype"] = (path_dtype, "cli:--model-path")
    values |= {name: (value, "cli") for name, value in cli.items()}
    if "model" not in values:
        raise BadInput(
            f"give --model {MODEL_CHOICES}, --model-path PATH, or --from-sglang with a --model-path"
        )
    return values


def _sources(values: dict[str, tuple[Any, str]]) -> dict[str, str]:
    return {
        name: values[name][1] if name in values else "default" for name in PlanInputs.model_fields
    }


def register(app: typer.Typer) -> None:
    """Adds ``plan`` to ``app``."""
    app.command("plan")(plan_command)
