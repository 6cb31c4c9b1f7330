"""``cpkv explain --out``: the phase each batch took, and why higher phases fell back."""

from __future__ import annotations

from cpkv.plots.base import Document, Plot, PlotFn, Series, Skip, level_color, new_figure
from cpkv.run.reason_codes import DISABLED

TOP_PHASE = 5
"""The highest phase; the phase axis runs 0..5."""


def fallback_counts(doc: Document) -> dict[str, int]:
    """``"3:HAS_HISTORY" -> count`` from the summary, DISABLED left out, by phase then code."""
    counts = {}
    for phase, codes in sorted(doc["summary"]["reasons_by_phase"].items()):
        for code, n in sorted(codes.items()):
            if code != DISABLED and n:
                counts[f"{phase}:{code}"] = int(n)
    return counts


def plot_phases_by_batch(doc: Document) -> Plot | Skip:
    """Left: the phase each batch took over the trace. Right: fallback reasons counted."""
    if not doc.get("batches"):
        return Skip("phases-by-batch", "the explain document has no batches")
    batches = tuple(b["batch"] for b in doc["batches"])
    phases = tuple(float(b["phase"]) for b in doc["batches"])
    figure = new_figure(11.0, 4.5, ncols=2)
    left, right = figure.axes
    for phase in sorted({int(p) for p in phases}):
        xs = [b for b, p in zip(batches, phases, strict=True) if p == phase]
        heights = [max(phase, 0.08)] * len(xs)  # NOTE: phase 0 shows as a sliver
        left.bar(xs, heights, color=level_color(phase), label=f"phase {phase}")
    deploy = doc["deployment"]
    enabled = ",".join(map(str, doc["enabled"])) or "none"
    title = (
        f"Phase each batch took (cp {deploy['cp_size']} {deploy['cp_mode']}, "
        f"page {deploy['page_size']}, enabled {enabled})"
    )
    left.set_title("phase each batch took")
    left.set_xlabel("batch (trace order)")
    left.set_ylabel("phase taken (0 = replicated baseline)")
    left.set_yticks(range(TOP_PHASE + 1))
    left.set_ylim(0, TOP_PHASE + 0.5)
    left.set_xticks(batches)
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=8, loc="upper left")
    counts = fallback_counts(doc)
    labels = tuple(counts)
    values = tuple(float(v) for v in counts.values())
    colors = [level_color(int(label.split(":")[0])) for label in labels]
    right.barh(range(len(labels)), values, color=colors)
    right.set_yticks(range(len(labels)), labels, fontsize=8)
    right.invert_yaxis()
    right.set_title("why higher phases fell back (phase:CODE)")
    right.set_xlabel("count over the trace (one per request, or per batch)")
    right.grid(axis="x", alpha=0.3)
    figure.suptitle(title)
    series = (
        Series("phase", batches, phases),
        Series("fallback reasons", labels, values),
    )
    return Plot("phases-by-batch", title, figure, series)


EXPLAIN_FIGURES: tuple[tuple[str, PlotFn], ...] = (("explain", plot_phases_by_batch),)
"""Every ``cpkv explain --out`` figure, drawn from ``explain.json``."""
