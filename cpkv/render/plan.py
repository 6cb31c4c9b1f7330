"""Human output of ``cpkv plan``: where each GiB of a rank goes, then the levels."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from cpkv.plan.capacity import REPLICATED_LEVEL, CapacityPlan, LevelCapacity
from cpkv.plan.memory_budget import FractionSource
from cpkv.render.cells import human_bytes

_FRACTION_NOTE = {
    FractionSource.GIVEN: "given",
    FractionSource.RESERVE: "from --reserve-gib",
    FractionSource.SGLANG_DEFAULT: "SGLang's default for this GPU",
}


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:,.2f}"


def _print(console: Console, text: str) -> None:
    console.print(text, highlight=False, markup=False)


def _where_each_gib_goes(plan: CapacityPlan) -> Table:
    gpu = plan.budget.gpu_bytes
    table = Table(title="where each GiB of one rank goes")
    table.add_column("item", no_wrap=True)
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    rows: list[tuple[str, int]] = [
        (f"weights: {group.name} (1/{group.split}, {group.dtype})", group.bytes_per_rank)
        for group in plan.weights.groups
        if group.bytes_per_rank
    ]
    rows += [
        ("KV pool at level 0 (level >= 2: less the scratch)", plan.kv_budget_bytes_per_rank),
        ("reserve: activations, CUDA graphs", plan.budget.reserve_bytes),
    ]
    for name, num_bytes in rows:
        table.add_row(name, _gib(num_bytes), f"{num_bytes / gpu:.1%}")
    table.add_row("total", _gib(gpu), "100.0%")
    return table


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


def _levels(plan: CapacityPlan) -> Table:
    table = Table(
        title=f"{plan.inputs.model} cp_size={plan.layout.cp_size} page_size={plan.inputs.page_size}"
    )
    for name in ("level", "KV"):
        table.add_column(name, no_wrap=True)
    for name in ("B/token/rank", "scratch", "tokens/rank", "tokens/deploy"):
        table.add_column(name, justify="right", no_wrap=True)
    for level in plan.levels:
        table.add_row(*_level_row(level, plan.layout.cp_size))
    return table


def render_plan(console: Console, plan: CapacityPlan, document: dict[str, Any]) -> None:
    """The inputs, where each GiB goes, one row per level, and the capacity gain."""
    layout, budget = plan.layout, plan.budget
    _print(
        console,
        f"{plan.inputs.model}: {plan.weights.dtype} weights, tp {layout.tp_size} / ep "
        f"{layout.ep_size} / dp-attention {layout.dp_attention} / cp {layout.cp_size} "
        f"(attention TP {layout.attn_tp_size}), KV {plan.inputs.kv_cache_dtype}: "
        f"{plan.bytes_per_token_all_layers:,} B/token = {plan.bytes_per_token_per_layer:,} "
        f"B/layer x {plan.num_layers} layers",
    )
    _print(
        console,
        f"GPU {_gib(budget.gpu_bytes)} GiB per rank: static {_gib(budget.static_bytes)} GiB "
        f"(mem_fraction_static {budget.mem_fraction_static:g}, "
        f"{_FRACTION_NOTE[budget.source]}) = weights + KV pool; reserve "
        f"{_gib(budget.reserve_bytes)} GiB",
    )
    console.print(_where_each_gib_goes(plan))
    console.print(_levels(plan))
    _print(
        console,
        f"level >= 2 holds {plan.capacity_gain:.2f}x the tokens of level 0 "
        f"(cp_size={layout.cp_size}); scratch = {_scratch_tokens(plan):,} tokens "
        f"({plan.inputs.max_view_tokens:,}-token view, {plan.inputs.materialize}"
        f"{', two buffers' if plan.inputs.materialize_prefetch else ''}) "
        f"x {plan.bytes_per_token_per_layer:,} B (one layer)",
    )
    longest = ", ".join(
        f"level {'2-5' if level.level else 0} {level.max_request_tokens:,} tokens "
        f"({level.max_request_limit})"
        for level in plan.levels
    )
    _print(console, f"longest request: {longest}")
    for note in document.get("notes", []):
        _print(console, f"note: {note}")
    for warning in document.get("warnings", []):
        _print(console, f"warning: {warning}")
    if document.get("ignored_args"):
        _print(console, "ignored: " + " ".join(document["ignored_args"]))


def _scratch_tokens(plan: CapacityPlan) -> int:
    return plan.sharded.scratch_bytes_per_rank // plan.bytes_per_token_per_layer
