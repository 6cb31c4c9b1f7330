"""``cpkv bench --out``: one figure per question, drawn from the ``cpkv bench --json`` document.

A figure whose key the document lacks (a bench document from an older build) is
skipped, not drawn empty.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes

from cpkv.plots.base import Document, Plot, PlotFn, Series, Skip, level_color, new_figure

KIB = 1024
"""Bytes per KiB: byte axes are drawn in KiB."""
PARTS = (
    ("write", "write: current chunk gathered for the KV write", "#4c72b0"),
    ("current_gather", "current gather: chunk gathered for the read only", "#55a868"),
    ("materialize", "materialize: history pages from their owners", "#dd8452"),
    ("tail", "tail: hidden states gathered", "#8172b3"),
)
"""The parts of ``bytes_by_batch``, bottom to top: JSON key, legend label, colour."""


def _bar_labels(ax: Axes, positions: Sequence[float], values: Sequence[float]) -> None:
    for x, value in zip(positions, values, strict=True):
        ax.annotate(f"{value:,.0f}", (x, value), ha="center", va="bottom", fontsize=8)


def _labelled_line(
    ax: Axes, x: Sequence[int], micros: Sequence[float], color: str, label: str
) -> None:
    """``micros`` against ``x`` as a line, each point's value written above it."""
    ax.plot(x, micros, marker="o", color=color, label=label)
    _bar_labels(ax, x, micros)


def _log2_axes(
    ax: Axes, title: str, ticks: Sequence[int], tick_labels: Sequence[str], x_label: str
) -> None:
    """Titles ``ax`` and draws its x axis in base-2 log with one labelled tick per point."""
    ax.set_title(title)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, tick_labels)
    ax.set_xlabel(x_label)


def plot_bytes_by_batch(doc: Document) -> Plot | Skip:
    """Bytes all-gathered per batch at each level, stacked by what they were for."""
    rows = doc.get("bytes_by_batch")
    if not rows:
        return Skip("bytes-by-batch", "the bench document has no 'bytes_by_batch'")
    levels = sorted({r["level"] for r in rows})
    batches = sorted({r["batch"] for r in rows})
    by_key = {(r["batch"], r["level"]): r for r in rows}
    keys = [(b, lv) for b in batches for lv in levels]
    positions = [b * (len(levels) + 1) + i for b in batches for i in range(len(levels))]
    figure = new_figure(10.0, 5.0)
    ax = figure.axes[0]
    bottom = [0.0] * len(keys)
    series = []
    for key, label, color in PARTS:
        values = tuple(float(by_key[k][key]) for k in keys)
        ax.bar(positions, [v / KIB for v in values], bottom=bottom, color=color, label=label)
        bottom = [b + v / KIB for b, v in zip(bottom, values, strict=True)]
        series.append(Series(key, tuple(f"batch {b} level {lv}" for b, lv in keys), values))
    ax.set_xticks(positions, [str(lv) for _ in batches for lv in levels], fontsize=8)
    for b in batches:
        center = b * (len(levels) + 1) + (len(levels) - 1) / 2
        ax.annotate(
            f"batch {b}",
            (center, 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -28),
            textcoords="offset points",
            ha="center",
        )
    cp_size = doc.get("step_time", {}).get("cp_size", "?")
    title = f"Bytes all-gathered per batch, levels {levels[0]}-{levels[-1]} (rank 0, cp {cp_size})"
    ax.set_title(title)
    ax.set_xlabel("level (bars), grouped by batch", labelpad=22)
    ax.set_ylabel("KiB all-gathered per batch")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return Plot("bytes-by-batch", title, figure, tuple(series))


def plot_gate_time(doc: Document) -> Plot | Skip:
    """Gate decision time per batch against batch size."""
    rows = doc.get("gate")
    if not rows:
        return Skip("gate-time", "the bench document has no 'gate'")
    bs = tuple(r["bs"] for r in rows)
    micros = tuple(float(r["microseconds_per_batch"]) for r in rows)
    figure = new_figure(7.0, 4.0)
    ax = figure.axes[0]
    label = "Gate.decide, every phase enabled"
    _labelled_line(ax, bs, micros, level_color(5), label)
    title = "Gate decision time per batch against batch size (median)"
    _log2_axes(ax, title, bs, [str(b) for b in bs], "batch size (requests per batch, log scale)")
    ax.set_ylabel("µs per batch")
    ax.set_ylim(0, max(micros) * 1.2)  # NOTE: headroom for the value labels
    ax.grid(alpha=0.3)
    ax.legend()
    return Plot("gate-time", title, figure, (Series(label, bs, micros),))


def _tokens(count: int) -> str:
    return f"{count // 1024}K" if count >= 1024 and count % 1024 == 0 else str(count)


def plot_host_plan_time(doc: Document) -> Plot | Skip:
    """Host-plan time per batch against history length, and per page-table entry."""
    rows = doc.get("host_plan")
    if not rows:
        return Skip("host-plan-time", "the bench document has no 'host_plan' figure")
    history = tuple(int(r["history_tokens"]) for r in rows)
    micros = tuple(float(r["microseconds"]) for r in rows)
    per_page = tuple(float(r["microseconds_per_page"]) for r in rows)
    figure = new_figure(7.0, 4.0)
    ax = figure.axes[0]
    label_us = "µs per batch (left)"
    _labelled_line(ax, history, micros, level_color(2), label_us)
    twin = ax.twinx()
    label = "µs per page-table entry (right)"
    twin.plot(history, per_page, marker="s", linestyle="--", color="#555555", label=label)
    twin.set_ylabel("µs per page-table entry")
    twin.set_ylim(0, max(per_page) * 1.4)
    requests = rows[0]["requests"]
    title = f"Host plan of one rank, {requests} requests, page 64: time against history"
    _log2_axes(
        ax, title, history, [_tokens(h) for h in history], "history tokens per request (log scale)"
    )
    ax.set_ylabel("µs per batch")
    ax.set_ylim(0, max(micros) * 1.4)
    ax.grid(alpha=0.3)
    # NOTE: one legend for both axes, so neither box covers the other.
    ax.legend([*ax.get_lines(), *twin.get_lines()], [label_us, label], loc="upper left")
    series = (
        Series("microseconds", history, micros),
        Series("microseconds_per_page", history, per_page),
    )
    return Plot("host-plan-time", title, figure, series)


def plot_remap_view_bytes(doc: Document) -> Plot | Skip:
    """Materialized view bytes under slot and unique remap, with and without a shared prefix."""
    rows = doc.get("remaps")
    if not rows:
        return Skip("remap-view-bytes", "the bench document has no 'remaps'")
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    remaps = list(dict.fromkeys(r["remap"] for r in rows))
    by_key = {(r["batch"], r["remap"]): float(r["view_bytes"]) for r in rows}
    figure = new_figure(7.0, 4.0)
    ax = figure.axes[0]
    width = 0.8 / len(remaps)
    series = []
    for i, remap in enumerate(remaps):
        positions = [b + (i - (len(remaps) - 1) / 2) * width for b in range(len(batches))]
        values = tuple(by_key[batch, remap] for batch in batches)
        label = f"{remap.removeprefix('materialized-')} remap ({remap})"
        ax.bar(positions, [v / KIB for v in values], width, label=label, color=level_color(i + 1))
        _bar_labels(ax, positions, [v / KIB for v in values])
        series.append(Series(remap, tuple(batches), values))
    ax.set_ylim(top=max(by_key.values()) / KIB * 1.3)
    title = "View buffer of one layer: slot vs unique remap (rank 0)"
    ax.set_title(title)
    ax.set_xticks(range(len(batches)), batches)
    ax.set_xlabel("measured batch (8 requests)")
    ax.set_ylabel("KiB per view (one layer)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right")
    return Plot("remap-view-bytes", title, figure, tuple(series))


def plot_pd_bytes(doc: Document) -> Plot | Skip:
    """Bytes each prefill rank sends to the decode server for the trace, per level."""
    rows = (doc.get("pd") or {}).get("levels")
    if not rows:
        return Skip("pd-bytes-by-rank", "the bench document has no 'pd.levels'")
    ranks = tuple(range(len(rows[0]["bytes_by_rank"])))
    figure = new_figure(7.0, 4.0)
    ax = figure.axes[0]
    width = 0.8 / len(rows)
    series = []
    for i, row in enumerate(rows):
        positions = [r + (i - (len(rows) - 1) / 2) * width for r in ranks]
        values = tuple(float(b) for b in row["bytes_by_rank"])
        label = f"level {row['level']}"
        ax.bar(
            positions,
            [v / KIB for v in values],
            width,
            label=label,
            color=level_color(row["level"]),
        )
        series.append(Series(label, ranks, values))
    even = sum(rows[-1]["bytes_by_rank"]) / len(ranks) / KIB
    ax.axhline(even, color="black", linestyle=":", label=f"even share (1/{len(ranks)})")
    ax.set_ylim(top=max(max(s.y) for s in series) / KIB * 1.3)
    title = f"Bytes each prefill rank sends to the decode server (cp {len(ranks)}, Mooncake)"
    ax.set_title(title)
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_xlabel("prefill rank")
    ax.set_ylabel("KiB sent for the whole trace")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=len(rows) + 1)
    return Plot("pd-bytes-by-rank", title, figure, tuple(series))


def plot_cp_off_step_time(doc: Document) -> Plot | Skip:
    """Step time with CP on over CP off against batch size, with the break-even marked."""
    figure_doc = doc.get("cp_off", {}).get("step_time")
    if not figure_doc or not figure_doc.get("sizes"):
        return Skip("cp-off-step-time", "the bench document has no 'cp_off' step time")
    rows = figure_doc["sizes"]
    tokens = tuple(int(r["tokens"]) for r in rows)
    ratios = tuple(float(r["ratio_on_to_off"]) for r in rows)
    figure = new_figure(7.0, 4.0)
    ax = figure.axes[0]
    label = "CP on / CP off (slowest rank, median)"
    ax.plot(tokens, ratios, marker="o", color=level_color(figure_doc["level"]), label=label)
    ax.axhline(1.0, color="black", linestyle=":", label="break-even (equal time)")
    even = figure_doc.get("break_even_tokens")
    if even is not None:
        ax.axvline(even, color="#2ca02c", linestyle="--", label=f"CP on faster from {even}")
    cp_size = doc["cp_off"].get("cp_size", "?")
    title = f"Step time, CP on over CP off, by batch size (cp {cp_size}, gloo)"
    _log2_axes(
        ax, title, tokens, [_tokens(t) for t in tokens], "current tokens in the batch (log scale)"
    )
    ax.set_ylabel("time with CP on / time with CP off")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return Plot("cp-off-step-time", title, figure, (Series(label, tokens, ratios),))


BENCH_FIGURES: tuple[tuple[str, PlotFn], ...] = tuple(
    ("bench", fn)
    for fn in (
        plot_bytes_by_batch,
        plot_gate_time,
        plot_host_plan_time,
        plot_remap_view_bytes,
        plot_pd_bytes,
        plot_cp_off_step_time,
    )
)
"""Every ``cpkv bench --out`` figure, each drawn from ``bench.json``."""
