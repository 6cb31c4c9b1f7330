"""``cpkv bench``'s tables, one per figure (the ``cp_off``, ``peer_read``, ``overlap``,
``rollback`` and PD ones in modules of their own)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console

from cpkv.bench.report import BenchReport
from cpkv.render.balance import render_balance
from cpkv.render.cells import figure_table, human_bytes
from cpkv.render.cp_off import render_cp_off
from cpkv.render.pd_bench import render_pd_figure
from cpkv.render.peer_read import render_overlap, render_peer_read
from cpkv.render.rollback import render_rollback
from cpkv.render.sglang_plugin import render_sglang_plugin
from cpkv.render.write_path import write_path_table


def render_bench(console: Console, report: BenchReport) -> None:
    """Each figure the run has as a table."""
    for render in _TABLES:
        render(console, report)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _gate(console: Console, report: BenchReport) -> None:
    if report.gate is None:
        return
    gate = figure_table("gate decision time per batch (median)", ("bs", "us / batch"))
    for timing in report.gate:
        gate.add_row(str(timing.bs), f"{timing.microseconds_per_batch:.1f}")
    console.print(gate)


def _host_plan(console: Console, report: BenchReport) -> None:
    if report.host_plan is None:
        return
    plans = figure_table(
        "host plan of one rank per batch (median), page 64",
        ("requests", "history/request", "page entries", "phase", "us / batch", "us / page"),
    )
    for plan in report.host_plan:
        plans.add_row(
            str(plan.requests),
            str(plan.history_tokens),
            str(plan.pages),
            str(plan.phase),
            f"{plan.microseconds:.0f}",
            f"{plan.microseconds_per_page:.3f}",
        )
    console.print(plans)


def _tail(console: Console, report: BenchReport) -> None:
    if report.tail_bytes is None:
        return
    tail = figure_table(
        "phase 1: tail bytes gathered per rank, one batch (tiny model)",
        ("cp_size", "mode", "bs", "tokens", "full gather", "narrow", "narrow/full"),
    )
    for tail_row in report.tail_bytes:
        tail.add_row(
            str(tail_row.cp_size),
            tail_row.cp_mode,
            str(tail_row.bs),
            str(tail_row.tokens),
            str(tail_row.full_gather_bytes),
            str(tail_row.narrow_bytes),
            f"{tail_row.ratio:.4f}",
        )
    console.print(tail)


def _kv_share(console: Console, report: BenchReport) -> None:
    if report.kv_share is None:
        return
    share = figure_table(
        "phase 2: persistent KV per rank after the trace",
        ("cp_size", "replicated", "sharded (max rank)", "fraction", "1/cp", "within 1 page/req"),
    )
    for kv in report.kv_share:
        share.add_row(
            str(kv.cp_size),
            human_bytes(kv.replicated_bytes),
            human_bytes(max(kv.sharded_bytes_by_rank)),
            f"{kv.max_fraction:.3f}",
            f"{1 / kv.cp_size:.3f}",
            "yes" if kv.within_target else "[red]no[/red]",
        )
    console.print(share)


def _materialized(console: Console, report: BenchReport) -> None:
    if report.materialized is None:
        return
    mat = figure_table(
        "materialized bytes per batch, rank 0 (level 2 vs level 3)",
        ("batch", "history", "level 2", "level 3"),
    )
    for m in report.materialized:
        mat.add_row(
            str(m.batch),
            "yes" if m.has_history else "no",
            human_bytes(m.level2_bytes),
            human_bytes(m.level3_bytes),
        )
    console.print(mat)


def _remaps(console: Console, report: BenchReport) -> None:
    if report.remaps is None:
        return
    remaps = figure_table(
        "slot vs unique remap: view buffer (one layer) and plan+materialize time",
        ("batch", "remap", "view bytes", "us (median)"),
    )
    for r in report.remaps:
        remaps.add_row(r.batch, r.remap, human_bytes(r.view_bytes), f"{r.microseconds:.0f}")
    console.print(remaps)


def _step_figures(console: Console, report: BenchReport) -> None:
    """The figures of the step-time runs: write-path bytes, pages per rank, step time."""
    if report.write_path is not None:
        console.print(write_path_table("write-path all-gather bytes per batch", report.write_path))
    if report.page_balance is not None:
        balance = figure_table(
            "pages stored per rank after the trace (owner-aware allocation at 5)",
            ("level", "pages by rank", "max/min"),
        )
        for b in report.page_balance:
            pages = " ".join(map(str, b.pages_by_rank))
            balance.add_row(str(b.level), pages, f"{b.max_over_min:.2f}")
        console.print(balance)
    if report.step_time is not None:
        steps = figure_table(
            f"end-to-end prefill of the trace, {report.step_time_cp_size} gloo ranks",
            ("level", "seconds (median)", "ratio to level 0"),
        )
        for t in report.step_time:
            steps.add_row(str(t.level), f"{t.seconds:.3f}", f"{t.ratio_to_level0:.2f}")
        console.print(steps)


def _figures(console: Console, report: BenchReport) -> None:
    """The figures with renderers of their own."""
    if report.cp_off is not None:
        render_cp_off(console, report.cp_off)
    if report.peer_read is not None:
        render_peer_read(console, report.peer_read, report.step_time_cp_size)
    if report.overlap is not None:
        render_overlap(console, report.overlap)
    if report.rollback is not None:
        render_rollback(console, report.rollback)
    if report.balance is not None:
        render_balance(console, report.balance)
    if report.pd is not None:
        render_pd_figure(console, report.pd)


def _sglang_plugin(console: Console, report: BenchReport) -> None:
    if report.sglang_plugin is not None:
        render_sglang_plugin(console, report.sglang_plugin)


_TABLES: tuple[Callable[[Console, BenchReport], None], ...] = (
    _gate,
    _host_plan,
    _tail,
    _kv_share,
    _materialized,
    _remaps,
    _step_figures,
    _figures,
    _sglang_plugin,
)
"""The tables, in the order they print."""
