"""The ``balance`` tables of ``cpkv bench``: each split's busiest rank over the mean per preset
and CP size, then the round-robin write path at levels 4 and 5."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from cpkv.bench.balance import ALIGNED_RULE, INTERLEAVE_RULE, BalanceFigure
from cpkv.render.write_path import write_path_table
from cpkv_core.planning import PAGE_INTERLEAVE_MAX_IMBALANCE, SplitStrategy

COLUMNS = {
    str(SplitStrategy.ROUND_ROBIN): "token-rr",
    str(SplitStrategy.PAGE_INTERLEAVED): "page-rr",
    INTERLEAVE_RULE: "rr phase 4",
    str(SplitStrategy.ZIGZAG): "zigzag",
    ALIGNED_RULE: "zz phase 4",
}
"""Table header of each split row."""


def render_balance(console: Console, figure: BalanceFigure) -> None:
    """One line per preset and CP size: tokens/work max over mean of each split."""
    table = Table(
        title=f"split balance, page {figure.page_size}: busiest rank / mean of tokens/work, "
        "summed over batches; n/N: batches phase 4 split by page"
    )
    for name in ("size", "preset", "cp", *COLUMNS.values(), "rr n/N", "zz n/N"):
        table.add_column(name, justify="right")
    rows = {(r.size, r.preset, r.cp_size, r.split): r for r in figure.splits}
    for size, preset, cp_size in dict.fromkeys(
        (r.size, r.preset, r.cp_size) for r in figure.splits
    ):
        cells = []
        for split in COLUMNS:
            row = rows[size, preset, cp_size, split]
            cells.append(f"{row.tokens_max_over_mean:.2f}/{row.work_max_over_mean:.2f}")
        rule, aligned = (
            rows[size, preset, cp_size, INTERLEAVE_RULE],
            rows[size, preset, cp_size, ALIGNED_RULE],
        )
        table.add_row(
            size,
            preset,
            str(cp_size),
            *cells,
            f"{rule.applied}/{rule.batches}",
            f"{aligned.applied}/{aligned.batches}",
        )
    console.print(table)
    console.print(
        f"page interleave rule: no idle rank, tokens and work max/mean <= "
        f"{PAGE_INTERLEAVE_MAX_IMBALANCE:.2f}",
        highlight=False,
    )
    title = f"round-robin write-path all-gather bytes per batch ({figure.cp_size} ranks)"
    console.print(write_path_table(title, figure.write_path))
