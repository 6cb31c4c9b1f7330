"""``cpkv plan``: KV memory and token capacity, replicated vs sharded; :func:`register` adds it.

Exit codes: 0 ok; 2 bad input (unknown model, an option out of range, or a budget that does
not cover one page, or at level >= 2 the materialization scratch plus one page).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cpkv.capacity import (
    DEFAULT_MAX_VIEW_TOKENS,
    DEFAULT_MEM_FRACTION,
    DEFAULT_PAGE_SIZE,
    REPLICATED_LEVEL,
    CapacityPlan,
    LevelCapacity,
    plan_capacity,
)
from cpkv.console import bad_input_exits, emit, out
from cpkv.out_dir import out_option, print_written
from cpkv.report import human_bytes
from cpkv_core.config import MODEL_PRESETS, model_preset

MODEL_CHOICES = "|".join(MODEL_PRESETS)


def plan_command(
    model_name: Annotated[
        str, typer.Option("--model", help=f"Model preset: {MODEL_CHOICES}.", show_default=False)
    ],
    cp_size: Annotated[int, typer.Option("--cp-size", help="CP ranks sharing the KV.")],
    gpu_mem_gib: Annotated[
        float, typer.Option("--gpu-mem-gib", help="GPU memory per rank, in GiB.")
    ],
    mem_fraction: Annotated[
        float,
        typer.Option(
            "--mem-fraction",
            help="Share of GPU memory given to the KV pool, in (0, 1]; weights and "
            "activations are budgeted outside it.",
        ),
    ] = DEFAULT_MEM_FRACTION,
    page_size: Annotated[
        int, typer.Option("--page-size", help="Tokens per KV page.")
    ] = DEFAULT_PAGE_SIZE,
    max_view_tokens: Annotated[
        int,
        typer.Option(
            "--max-view-tokens",
            help="Tokens of the largest KV view one batch reads (history + current); sizes "
            "the level >= 2 materialization scratch.",
        ),
    ] = DEFAULT_MAX_VIEW_TOKENS,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document on stdout.")
    ] = False,
    out_dir: Annotated[
        Path | None, out_option("plan.json, capacity.json (cp 1-8) and capacity.png")
    ] = None,
) -> None:
    """KV memory and token capacity per rank and per deployment: level 0 (replicated KV)
    vs levels >= 2 (sharded KV, materialization scratch counted)."""
    with bad_input_exits():
        model = model_preset(model_name)
        plan = plan_capacity(model, cp_size, page_size, gpu_mem_gib, mem_fraction, max_view_tokens)
    emit(as_json, plan.to_json(), lambda: render_plan(out, plan))
    if out_dir is not None:
        # NOTE: matplotlib loads only when figures are asked for.
        from cpkv.plots import write_outputs
        from cpkv.plots.capacity import capacity_sweep, plot_capacity

        args = (page_size, gpu_mem_gib, mem_fraction, max_view_tokens)
        documents = {"plan": plan.to_json(), "capacity": capacity_sweep(model, cp_size, *args)}
        print_written(write_outputs(out_dir, "plan", documents, [("capacity", plot_capacity)]))


def _level_row(level: LevelCapacity, cp_size: int) -> tuple[str, ...]:
    sharded = level.level != REPLICATED_LEVEL
    return (
        "2-5" if sharded else str(level.level),
        f"sharded 1/{cp_size}" if sharded else "replicated",
        human_bytes(level.kv_bytes_per_token_per_rank),
        human_bytes(level.scratch_bytes_per_rank) if sharded else "-",
        f"{level.tokens_per_rank:,}",
        f"{level.tokens_per_deployment:,}",
    )


def render_plan(console: Console, plan: CapacityPlan) -> None:
    """What is counted, one row per level, and the capacity gain in one line."""
    console.print(
        f"{plan.model}: {plan.bytes_per_token_all_layers:,} B/token = "
        f"{plan.bytes_per_token_per_layer:,} B/layer in production storage "
        f"(bf16 latent, fp8 index K, fp32 scale) "
        f"x {plan.bytes_per_token_all_layers // plan.bytes_per_token_per_layer} layers",
        highlight=False,
        markup=False,
    )
    console.print(
        f"KV budget/rank {human_bytes(plan.kv_budget_bytes_per_rank)} = "
        f"{plan.gpu_mem_gib:g} GiB x {plan.mem_fraction:g}; level >= 2 scratch = "
        f"{plan.max_view_tokens:,} view tokens x {plan.bytes_per_token_per_layer:,} B (one layer)",
        highlight=False,
        markup=False,
    )
    title = f"{plan.model} cp_size={plan.cp_size} page_size={plan.page_size}"
    table = Table(title=title)
    for name in ("level", "KV"):
        table.add_column(name, no_wrap=True)
    for name in ("B/token/rank", "scratch", "tokens/rank", "tokens/deploy"):
        table.add_column(name, justify="right", no_wrap=True)
    for level in plan.levels:
        table.add_row(*_level_row(level, plan.cp_size))
    console.print(table)
    console.print(
        f"level >= 2 holds {plan.capacity_gain:.2f}x the tokens of level 0 "
        f"(cp_size={plan.cp_size})",
        highlight=False,
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Adds ``plan`` to ``app``."""
    app.command("plan")(plan_command)
