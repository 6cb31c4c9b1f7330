"""The ``rollback`` table of ``cpkv bench``: the rollback's save copy against the batch's run."""

from __future__ import annotations

from rich.console import Console

from cpkv.bench.rollback import RollbackFigure
from cpkv.render.cells import figure_table, short_bytes


def render_rollback(console: Console, figure: RollbackFigure) -> None:
    """One line per level: save over step (median over batches), the busiest rank's saved
    bytes per batch (mean) and every rank's saved bytes over the trace; then the headline."""
    table = figure_table(
        f"rollback save copy vs batch time, {figure.cp_size} in-process ranks "
        f"(save: median of {figure.repeats}, slowest rank)",
        ("level", "save/step (median)", "saved/batch, busiest rank", "saved, all ranks"),
    )
    for level in figure.levels:
        summary = figure.summary(level)
        table.add_row(
            str(level),
            f"{summary.save_over_step:.5f}",
            short_bytes(summary.saved_bytes_per_batch),
            short_bytes(summary.saved_bytes),
        )
    console.print(table)
    headline = figure.summary()
    console.print(
        f"rollback save copy: {headline.save_over_step:.3%} of a batch's time (median over "
        f"levels {'/'.join(map(str, figure.levels))} and batches), "
        f"{short_bytes(headline.saved_bytes_per_batch)} per batch on the busiest rank (mean)"
    )
