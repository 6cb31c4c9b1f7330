"""Tables of ``cpkv bench --rows MODEL`` (the JSON has every entry; the tables show the
longest history in full and the rest in summary)."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from cpkv.bench.rows import GOAL_RATIO, RowsReport
from cpkv.bench.rows.figures import RowsEntry, projection, slot_vs_unique
from cpkv.bench.rows.timing import NOISY_SPREAD
from cpkv.render.cells import human_bytes

__all__ = ["render_rows"]

MIB = 1 << 20


def _mib(num: int | None) -> str:
    return "-" if num is None else f"{num / MIB:,.1f}"


def _spread(entry: RowsEntry) -> str:
    """The lowest and highest per-round ratio, marked when the entry is noisy."""
    spread = f"{entry.timing.ratio_low:.2f}-{entry.timing.ratio_high:.2f}"
    return f"[yellow]{spread} noisy[/yellow]" if entry.timing.noisy else spread


def _ops_table(report: RowsReport, history: int) -> Table:
    table = Table(title=f"{report.model} rows, history {history}: one layer (tail: one chunk)")
    names = ("op", "variant", "bs", "cp", "shared", "MiB", "ms", "GB/s", "ratio", "spread")
    for name in (*names, "best"):
        table.add_column(name, justify="right")
    for name in ("scratch MiB", "plan MiB"):
        table.add_column(name, justify="right")
    for e in report.entries:
        if e.history != history:
            continue
        ratio = f"{e.ratio_to_copy:.2f}"
        table.add_row(
            e.op,
            e.variant,
            str(e.bs),
            str(e.cp_size),
            "yes" if e.shared_prefix else "",
            _mib(e.bytes),
            f"{e.seconds * 1e3:,.2f}",
            f"{e.gb_per_s:.2f}",
            ratio if e.ratio_to_copy >= GOAL_RATIO else f"[red]{ratio}[/red]",
            _spread(e),
            f"{e.ratio_to_copy_best:.2f}",
            _mib(e.scratch_bytes),
            _mib(e.planned_scratch_bytes),
        )
    return table


def _summary_table(report: RowsReport) -> Table:
    table = Table(title="lowest ratio_to_copy of each op over its points, by history")
    table.add_column("op")
    table.add_column("variant")
    histories = sorted(report.grid.histories)
    for history in histories:
        table.add_column(str(history), justify="right")
    lowest: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for e in report.entries:
        row = lowest[(e.op, e.variant)]
        row[e.history] = min(row.get(e.history, float("inf")), e.ratio_to_copy)
    for (op, variant), by_history in lowest.items():
        cells = [f"{by_history[h]:.2f}" if h in by_history else "-" for h in histories]
        table.add_row(op, variant, *cells)
    return table


def _projection_table(report: RowsReport, history: int) -> Table:
    table = Table(
        title=f"one chunk over {report.num_layers} layers, history {history}, gather + unique "
        "remap (the phase-2 default): seconds and (vs level 0)"
    )
    for name in ("bs", "cp", *(f"level {lv}" for lv in range(6))):
        table.add_column(name, justify="right")
    rows = [
        r
        for r in projection(report.entries, report.num_layers)
        if r.history == history and r.read == "unique"
    ]
    for bs, cp in sorted({(r.bs, r.cp_size) for r in rows}):
        cells = [
            f"{r.seconds:.3f} ({r.seconds_vs_level0:+.3f})"
            for r in rows
            if (r.bs, r.cp_size) == (bs, cp)
        ]
        table.add_row(str(bs), str(cp), *cells)
    return table


def _remap_table(report: RowsReport) -> Table:
    table = Table(title="slot vs unique remap, one chunk over all layers (view + host plan)")
    names = ("history", "bs", "cp", "shared", "read", "MiB slot", "MiB unique", "s slot")
    for name in (*names, "s unique", "scratch slot", "scratch unique", "winner"):
        table.add_column(name, justify="right")
    for r in slot_vs_unique(report.entries, report.num_layers):
        if r.bs == 1:
            continue
        table.add_row(
            str(r.history),
            str(r.bs),
            str(r.cp_size),
            "yes" if r.shared_prefix else "",
            r.read,
            _mib(r.slot_bytes),
            _mib(r.unique_bytes),
            f"{r.slot_seconds:.3f}",
            f"{r.unique_seconds:.3f}",
            _mib(r.slot_scratch_bytes),
            _mib(r.unique_scratch_bytes),
            r.winner,
        )
    return table


def _heading(report: RowsReport) -> str:
    """What ran, on what, and what the copy runs past."""
    cache = report.last_level_cache_bytes
    return (
        f"{report.model}: {report.row_bytes} B a token a layer ({report.kv_cache_dtype}), "
        f"{report.num_layers} layers, rank 0 of each point on {report.device} "
        f"({report.threads} torch threads, {report.allocator} allocator, {report.clock} "
        f"clock, {report.placements} passes over the grid), {report.seconds:.0f} s; "
        f"the copy between two buffers of {human_bytes(report.copy_buffer_bytes)} "
        f"(last-level cache: {human_bytes(cache) if cache else 'not known'})"
    )


def render_rows(console: Console, report: RowsReport) -> None:
    """The real-rows figures as tables, then the goal's verdict."""
    console.print(_heading(report))
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    longest = max(report.grid.histories)
    console.print(_ops_table(report, longest))
    noisy = sum(e.timing.noisy for e in report.entries)
    console.print(
        "ratio: the copy's median round over the op's, the rounds of every pass pooled; "
        "spread: the lowest and highest ratio within one round; noisy: a spread over "
        f"{NOISY_SPREAD} of the ratio ({noisy} of {len(report.entries)} entries)"
    )
    console.print(_summary_table(report))
    console.print(_projection_table(report, longest))
    console.print(_remap_table(report))
    below = report.below_goal
    at_longest = sum(1 for e in report.entries if e.history == longest)
    if not below:
        console.print(
            f"goal: all {at_longest} ops at history {longest} reach {GOAL_RATIO} of the copy rate"
        )
        return
    names = ", ".join(f"{e.op}/{e.variant} bs {e.bs} cp {e.cp_size}" for e in below)
    console.print(
        f"[red]goal missed[/red]: {len(below)} of {at_longest} ops at history {longest} "
        f"under {GOAL_RATIO} of the copy rate: {names}"
    )
