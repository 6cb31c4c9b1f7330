"""The ``sglang_plugin`` table of ``cpkv bench``: SGLang's tail all-gather, stock vs plugin."""

from __future__ import annotations

from rich.console import Console

from cpkv.bench.sglang_plugin import SglangPluginFigure
from cpkv.render.cells import figure_table, short_bytes


def render_sglang_plugin(console: Console, figure: SglangPluginFigure) -> None:
    """One line per batch size: rows and bytes a rank's tail all-gather holds, stock and
    with cpkv's plugin; or why the section was skipped."""
    if figure.skipped:
        console.print(f"sglang_plugin: {figure.skipped}", highlight=False, markup=False)
        return
    table = figure_table(
        f"sglang_plugin: SGLang 0.5.23's tail all-gather per rank, stock vs cpkv's plugin "
        f"(phase 1), cp {figure.cp_size} {figure.strategy}, hidden {figure.hidden} x "
        f"{figure.dtype}, {figure.tokens_per_request} tokens a request",
        ("bs", "tokens", "rows stock", "rows plugin", "bytes stock", "bytes plugin", "ratio"),
    )
    for row in figure.rows:
        table.add_row(
            str(row.bs),
            str(row.tokens),
            str(row.stock_rows),
            str(row.plugin_rows),
            short_bytes(row.stock_bytes),
            short_bytes(row.plugin_bytes),
            f"{row.ratio:.3f}",
        )
    console.print(table)
    verdict = "bitwise equal" if figure.logits_bitwise_equal else "DIFFERENT"
    console.print(f"sglang_plugin: logits on every rank and batch {verdict} to stock SGLang")
