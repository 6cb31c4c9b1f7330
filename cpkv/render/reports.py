"""Human-readable reports (rich tables) for the CLI: the phase mix, the phase table, PD and
dry runs; the per-batch ones are in :mod:`cpkv.render.batches`, bench's in
:mod:`cpkv.render.bench`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cpkv.render.cells import figure_table
from cpkv.run.dry_run import DryRunReport
from cpkv.run.explain import ExplainReport
from cpkv.run.pd_check import PdReport
from cpkv.run.phase_mix import PhaseMix


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


def render_pd(console: Console, report: PdReport) -> None:
    """One row per request: ready, rebuilt KV, decode step (top-k and |diff|), bytes each
    prefill rank sent."""
    decode = (
        "1 non-CP decode server"
        if report.decode_cp_size == 1
        else f"{report.decode_cp_size} decode CP ranks"
    )
    table = figure_table(
        f"PD: {report.cp_size} CP prefill ranks -> {decode}",
        ("rid", "level", "ready", "KV rebuilt", "decode |diff|", "KiB sent by rank"),
    )
    table.add_column("errors")
    for r in report.requests:
        diff = "-" if r.decode_max_abs_diff is None else f"{r.decode_max_abs_diff:.3g}"
        if r.ready and not r.decode_topk_equal:
            diff += " [red]top-k differs[/red]"
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
            "decode side, decode step equal to the reference (top-k sets exactly)"
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


def render_phase_mix(console: Console, mix: PhaseMix, title: str) -> None:
    """One row per phase with its shares, then the fallback codes of each enabled phase."""
    table = figure_table(
        f"{title}: {mix.batches} batches, {mix.tokens:,} tokens",
        ("phase", "batches", "batch share", "tokens", "token share"),
    )
    for share in mix.shares:
        table.add_row(
            str(share.phase),
            str(share.batches),
            f"{share.batch_share:.1%}",
            f"{share.tokens:,}",
            f"{share.token_share:.1%}",
        )
    console.print(table)
    off = mix.cp_off
    console.print(
        f"CP off (CP_OFF, split none): {off.batches} batches ({off.batch_share:.1%}), "
        f"{off.tokens:,} tokens ({off.token_share:.1%})",
        highlight=False,
        markup=False,
    )
    for phase, codes in mix.fallbacks.items():
        text = ", ".join(f"{code} x{n}" for code, n in codes.items()) or "never"
        console.print(
            f"phase {phase} fell back (batches by code): {text}", highlight=False, markup=False
        )
