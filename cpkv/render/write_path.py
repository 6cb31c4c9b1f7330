"""The write path's current-KV all-gather bytes, per batch and level (0 where phase 5 writes
directly): one table for ``cpkv bench``'s figure and its round-robin twin."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from cpkv.bench.bytes import WritePathBytes
from cpkv.render.cells import human_bytes


def write_path_table(title: str, rows: Sequence[WritePathBytes]) -> Table:
    """Batches down, levels across; each cell is rank 0's bytes and the chosen phase."""
    levels = sorted({row.level for row in rows})
    table = Table(title=f"{title}, rank 0 [chosen phase]")
    table.add_column("batch", justify="right")
    for level in levels:
        table.add_column(f"level {level}", justify="right")
    by_key = {(row.level, row.batch): row for row in rows}
    for batch in sorted({row.batch for row in rows}):
        cells = [
            f"{human_bytes(by_key[level, batch].write_path_bytes)} [{by_key[level, batch].phase}]"
            for level in levels
        ]
        table.add_row(str(batch), *cells)
    return table
