"""The ``cp_off`` figure of ``cpkv bench`` as two tables: bytes with CP on and off for the
batches below the minimum, then step time on/off by batch size with the break-even."""

from __future__ import annotations

from rich.console import Console

from cpkv.bench.cp_off import CpOffFigure
from cpkv.render.cells import figure_table, short_bytes


def render_cp_off(console: Console, figure: CpOffFigure) -> None:
    """Bytes per batch below the minimum (CP on -> off), then the timed sizes."""
    table = figure_table(
        f"CP off: rank 0 bytes of batches below {figure.min_tokens} tokens, on -> off",
        ("level", "batch", "tokens", "phase", "current gather", "tail", "materialize"),
    )
    rows = {(r.level, r.batch, r.cp): r for r in figure.bytes}
    for level, batch, cp in rows:
        if cp != "on":
            continue
        on, off = rows[level, batch, "on"], rows[level, batch, "off"]
        table.add_row(
            str(level),
            str(batch),
            str(on.tokens),
            f"{on.phase}->{off.phase}",
            f"{short_bytes(on.current_gather)}->{short_bytes(off.current_gather)}",
            f"{short_bytes(on.tail)}->{short_bytes(off.tail)}",
            f"{short_bytes(on.materialize)}->{short_bytes(off.materialize)}",
        )
    console.print(table)
    times = figure_table(
        f"CP on vs off: one batch at level {figure.time_level}, {figure.cp_size} gloo "
        "ranks, slowest rank (median)",
        ("tokens", "requests", "CP on s", "CP off s", "on/off"),
    )
    for row in figure.times:
        times.add_row(
            str(row.tokens),
            str(row.requests),
            f"{row.cp_on_seconds:.4f}",
            f"{row.cp_off_seconds:.4f}",
            f"{row.ratio:.2f}",
        )
    console.print(times)
    even = figure.break_even_tokens
    verdict = (
        f"break-even: CP on is faster from {even} tokens on; pick "
        f"--nsa-prefill-cp-min-tokens {even}"
        if even is not None
        else "break-even: CP off was faster at every size measured"
    )
    console.print(verdict, highlight=False)
