"""``cpkv bench --rows MODEL``: cpkv's data movement at a production model's row widths and
lengths against the device's copy rate (``run``; docs/real-rows.md)."""

from cpkv.bench.rows.figures import RowsEntry, projection, slot_vs_unique
from cpkv.bench.rows.run import GOAL_RATIO, PLACEMENTS, ROWS_REPEATS, RowsReport, run_rows_bench
from cpkv.bench.rows.setup import GRIDS, RowsGrid
from cpkv.bench.rows.timing import NOISY_SPREAD, Timing

__all__ = [
    "GOAL_RATIO",
    "GRIDS",
    "NOISY_SPREAD",
    "PLACEMENTS",
    "ROWS_REPEATS",
    "RowsEntry",
    "RowsGrid",
    "RowsReport",
    "Timing",
    "projection",
    "run_rows_bench",
    "slot_vs_unique",
]
