"""Human-readable reports (rich tables) for the CLI; the per-batch ones are in
:mod:`cpkv.batch_tables`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cpkv.bench import BenchReport
from cpkv.dry_run import DryRunReport
from cpkv.explain import ExplainReport
from cpkv.pd import PdReport
from cpkv.phase_mix import render_phase_mix
from cpkv.report_balance import render_balance
from cpkv.report_cp_off import render_cp_off
from cpkv.report_peer_read import render_overlap, render_peer_read
from cpkv.report_rollback import render_rollback


def human_bytes(num: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB"):
        if abs(num) < 1024:
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} GiB"


def render_explain_summary(console: Console, report: ExplainReport) -> None:
    """The phase mix: shares of batches and tokens per phase, fallbacks by code."""
    deploy = report.deploy
    enabled = ",".join(str(int(p)) for p in sorted(report.enabled)) or "none"
    title = (
        f"phase mix, cp_size={deploy.cp_size} {deploy.cp_mode} page_size={deploy.page_size} "
        f"enabled={enabled}"
    )
    render_phase_mix(console, report.mix(), title)


def render_phases(console: Console, rows: list[dict[str, Any]]) -> None:
    """The phase table."""
    table = Table(title="phases")
    for name in ("#", "name", "flag", "needs", "enabled", "available", "start-up contract"):
        table.add_column(name)
    for row in rows:
        if row["startup_ok"] is None:
            contract = "-"
        elif row["startup_ok"]:
            contract = "[green]holds[/green]"
        else:
            contract = "[red]" + "; ".join(row["startup_reasons"]) + "[/red]"
        table.add_row(
            str(row["phase"]),
            row["name"],
            row["flag"],
            ",".join(map(str, row["needs"])) or "-",
            "yes" if row["enabled"] else "no",
            "yes" if row["available"] else "no (not built yet)",
            contract,
        )
    console.print(table)


def render_bench(console: Console, report: BenchReport) -> None:
    """Each figure as a table."""
    gate = Table(title="gate decision time per batch (median)")
    gate.add_column("bs", justify="right")
    gate.add_column("us / batch", justify="right")
    for timing in report.gate:
        gate.add_row(str(timing.bs), f"{timing.microseconds_per_batch:.1f}")
    console.print(gate)
    plans = Table(title="host plan of one rank per batch (median), page 64")
    for name in ("requests", "history/request", "page entries", "phase", "us / batch", "us / page"):
        plans.add_column(name, justify="right")
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
    tail = Table(title="phase 1: tail bytes gathered per rank, one batch (tiny model)")
    for name in ("cp_size", "mode", "bs", "tokens", "full gather", "narrow", "narrow/full"):
        tail.add_column(name, justify="right")
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
    share = Table(title="phase 2: persistent KV per rank after the trace")
    for name in (
        "cp_size",
        "replicated",
        "sharded (max rank)",
        "fraction",
        "1/cp",
        "within 1 page/req",
    ):
        share.add_column(name, justify="right")
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
    mat = Table(title="materialized bytes per batch, rank 0 (level 2 vs level 3)")
    for name in ("batch", "history", "level 2", "level 3"):
        mat.add_column(name, justify="right")
    for m in report.materialized:
        mat.add_row(
            str(m.batch),
            "yes" if m.has_history else "no",
            human_bytes(m.level2_bytes),
            human_bytes(m.level3_bytes),
        )
    console.print(mat)
    remaps = Table(title="slot vs unique remap: view buffer (one layer) and plan+materialize time")
    for name in ("batch", "remap", "view bytes", "us (median)"):
        remaps.add_column(name, justify="right")
    for r in report.remaps:
        remaps.add_row(r.batch, r.remap, human_bytes(r.view_bytes), f"{r.microseconds:.0f}")
    console.print(remaps)
    console.print(_write_path_table(report))
    balance = Table(title="pages stored per rank after the trace (owner-aware allocation at 5)")
    for name in ("level", "pages by rank", "max/min"):
        balance.add_column(name, justify="right")
    for b in report.page_balance:
        balance.add_row(str(b.level), " ".join(map(str, b.pages_by_rank)), f"{b.max_over_min:.2f}")
    console.print(balance)
    steps = Table(title=f"end-to-end prefill of the trace, {report.step_time_cp_size} gloo ranks")
    for name in ("level", "seconds (median)", "ratio to level 0"):
        steps.add_column(name, justify="right")
    for t in report.step_time:
        steps.add_row(str(t.level), f"{t.seconds:.3f}", f"{t.ratio_to_level0:.2f}")
    console.print(steps)
    render_cp_off(console, report.cp_off)
    render_peer_read(console, report.peer_read, report.step_time_cp_size)
    render_overlap(console, report.overlap)
    render_rollback(console, report.rollback)
    render_balance(console, report.balance)
    pd = Table(
        title=f"PD: bytes each prefill rank sent for the trace (Mooncake, loopback; "
        f"{report.pd.model}, {report.pd.row_bytes_per_token} B per token)"
    )
    names = (
        "level",
        "bytes by rank",
        "writes by rank",
        "busiest share",
        "MiB/s",
        "large write",
        "ceiling",
    )
    for name in names:
        pd.add_column(name, justify="right")
    for sent in report.pd.levels:
        pd.add_row(
            str(sent.level),
            " ".join(human_bytes(b) for b in sent.bytes_by_rank),
            " ".join(map(str, sent.write_calls_by_rank)),
            f"{sent.max_share:.3f}",
            f"{sent.mib_per_second:.0f}",
            f"{sent.large_write_mib_per_second:.0f}",
            f"{sent.concurrent_mib_per_second:.0f}",
        )
    console.print(pd)
    figure = report.pd
    console.print(
        f"PD send path {figure.send_mib_per_second:.0f} MiB/s (group "
        f"{figure.group_mib_per_second:.0f}) vs one large write of the same bytes "
        f"{figure.large_write_mib_per_second:.0f} MiB/s: ratio {figure.throughput_ratio:.2f} "
        f"(group {figure.group_throughput_ratio:.2f}); medians over levels"
    )
    console.print(
        f"PD ceiling, every rank writing its share in one call at once: ratio "
        f"{figure.ceiling_ratio:.2f} (group {figure.group_ceiling_ratio:.2f}); the send "
        f"path gets {figure.of_ceiling:.2f} of it"
    )
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _write_path_table(report: BenchReport) -> Table:
    """Current-KV all-gather bytes the write needs, per batch and level (0 at level 5)."""
    levels = sorted({row.level for row in report.write_path})
    table = Table(title="write-path all-gather bytes per batch, rank 0 [chosen phase]")
    table.add_column("batch", justify="right")
    for level in levels:
        table.add_column(f"level {level}", justify="right")
    by_key = {(row.level, row.batch): row for row in report.write_path}
    for batch in sorted({row.batch for row in report.write_path}):
        cells = [
            f"{human_bytes(by_key[level, batch].write_path_bytes)} [{by_key[level, batch].phase}]"
            for level in levels
        ]
        table.add_row(str(batch), *cells)
    return table


def render_pd(console: Console, report: PdReport) -> None:
    """One row per request: ready, rebuilt KV, decode step, bytes each prefill rank sent."""
    table = Table(title=f"PD: {report.cp_size} CP prefill ranks -> 1 non-CP decode server")
    for name in ("rid", "level", "ready", "KV rebuilt", "decode |diff|", "KiB sent by rank"):
        table.add_column(name, justify="right")
    table.add_column("errors")
    for r in report.requests:
        diff = "-" if r.decode_max_abs_diff is None else f"{r.decode_max_abs_diff:.3g}"
        table.add_row(
            r.rid,
            str(r.level),
            "yes" if r.ready else "[red]no[/red]",
            "equal" if r.kv_equal else "[red]differs[/red]",
            diff,
            " ".join(f"{b / 1024:.1f}" for b in r.bytes_by_rank),
            "; ".join(r.errors) or "-",
        )
    console.print(table)
    for error in report.errors:
        console.print(f"[red]error:[/red] {error}")
    if report.ok:
        console.print(
            f"[green]OK[/green]: {len(report.requests)} requests rebuilt byte for byte on the "
            "decode side, decode step equal to the reference"
        )
    else:
        bad = sum(not r.ok for r in report.requests)
        console.print(f"[red]FAILED[/red]: {bad} request(s) did not transfer or check out")


def render_dry_run(console: Console, report: DryRunReport) -> None:
    """One line per level: ok, or the op that failed and where."""
    for level in report.levels:
        if level.ok:
            console.print(
                f"level {level.level}: [green]ok[/green] ({level.batches} batches on meta, "
                f"cp_size={report.cp_size})"
            )
        else:
            console.print(
                f"level {level.level}: [red]FAILED[/red] {escape(level.error or '')} "
                f"at {escape(level.where or '?')}"
            )
