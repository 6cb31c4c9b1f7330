"""Human-readable reports (rich tables) for the CLI."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from cpkv.verify import VerifyReport
from cpkv_core.config import DeploymentConfig
from cpkv_core.outputs import OUTPUT_ATOL


def human_bytes(num: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num) < 1024 or unit == "GiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    raise AssertionError("unreachable")


def render_verify_table(console: Console, report: VerifyReport, deploy: DeploymentConfig) -> None:
    """One row per (level, batch), then a one-line verdict."""
    table = Table(title=f"cp_size={deploy.cp_size} {deploy.cp_mode} page_size={deploy.page_size}")
    for name in (
        "level",
        "batch",
        "tokens",
        "gathered / rank",
        "KV / rank",
        "max |diff|",
        "top-k",
        "ok",
    ):
        table.add_column(name, justify="right")
    for level in report.levels:
        for row in level.rows:
            gathered = max(row.gathered_bytes_by_rank)
            kv = max(row.kv_bytes_by_rank)
            cmp = row.comparison
            table.add_row(
                str(row.level),
                str(row.batch),
                str(row.tokens),
                human_bytes(gathered),
                human_bytes(kv),
                f"{cmp.max_abs_diff:.3g}",
                "equal" if cmp.topk_equal else f"{cmp.topk_mismatches} rows differ",
                "[green]yes[/green]" if cmp.ok else "[red]NO[/red]",
            )
    console.print(table)
    levels = ", ".join(f"level {lv.level} max |diff| {lv.max_abs_diff:.3g}" for lv in report.levels)
    if report.ok:
        console.print(
            f"[green]OK[/green]: every batch equals the reference (top-k sets exact, "
            f"outputs within {OUTPUT_ATOL:g}); {levels}"
        )
    else:
        bad = sum(not r.comparison.ok for lv in report.levels for r in lv.rows)
        console.print(f"[red]FAILED[/red]: {bad} batch(es) differ from the reference; {levels}")
