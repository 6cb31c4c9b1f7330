"""``cpkv plan --out``: tokens per deployment by level as CP grows, for one model preset."""

from __future__ import annotations

from typing import Any

from matplotlib.ticker import FuncFormatter

from cpkv.plan.capacity import plan_capacity
from cpkv.plan.inputs import PlanInputs
from cpkv.plots.base import Document, Plot, Series, Skip, level_color, new_figure

SWEEP_CP_SIZES = tuple(range(1, 9))
"""CP sizes the capacity figure always covers."""


def capacity_sweep(inputs: PlanInputs) -> dict[str, Any]:
    """The ``cpkv plan`` document for every CP size 1..8 (and the asked one), all else as
    asked; a CP size the layout refuses (e.g. a TP size it does not divide) is left out."""
    plans = []
    for cp_size in sorted({*SWEEP_CP_SIZES, inputs.cp_size}):
        try:
            plans.append(plan_capacity(inputs.model_copy(update={"cp_size": cp_size})))
        except ValueError:
            continue
    return {
        "model": inputs.model,
        "gpu_mem_gib": inputs.gpu_mem_gib,
        "page_size": inputs.page_size,
        "chosen_cp_size": inputs.cp_size,
        "plans": [plan.to_json() for plan in plans],
    }


def _millions(value: float, _: object) -> str:
    return f"{value / 1e6:g}M"


def plot_capacity(sweep: Document) -> Plot | Skip:
    """Tokens per deployment at level 0 (replicated) and levels 2-5 (sharded) against CP size."""
    if "plans" not in sweep:
        return Skip("capacity", "the document has no 'plans' (not a capacity sweep)")
    cp_sizes = tuple(p["cp_size"] for p in sweep["plans"])
    series = []
    figure = new_figure()
    ax = figure.axes[0]
    for index, (label, level) in enumerate(
        (("level 0: replicated KV", 0), ("levels 2-5: sharded KV, scratch counted", 2))
    ):
        tokens = tuple(float(p["levels"][index]["tokens_per_deployment"]) for p in sweep["plans"])
        ax.plot(cp_sizes, tokens, marker="o", color=level_color(level), label=label)
        series.append(Series(label, cp_sizes, tokens))
    last = sweep["plans"][-1]
    ax.annotate(
        f"{last['capacity_gain']:.2f}x at cp {last['cp_size']}",
        (cp_sizes[-1], series[1].y[-1]),
        textcoords="offset points",
        xytext=(-10, -18),
        ha="right",
    )
    ax.axvline(sweep["chosen_cp_size"], color="#bbbbbb", linestyle=":", label="chosen cp_size")
    title = f"{sweep['model']}, {sweep['gpu_mem_gib']:g} GiB per GPU: KV tokens per deployment"
    ax.set_title(title)
    ax.set_xlabel("cp_size (ranks sharing the KV)")
    ax.set_ylabel("tokens per deployment")
    ax.yaxis.set_major_formatter(FuncFormatter(_millions))
    ax.set_xticks(cp_sizes)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return Plot("capacity", title, figure, tuple(series))
