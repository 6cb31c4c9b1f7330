"""``cpkv bench``'s PD tables: the bytes and throughput of every level to a non-CP decode
server, then the top level re-sharded to decode groups of M = 1, M = N and M != N ranks."""

from __future__ import annotations

from rich.console import Console

from cpkv.bench.pd_figure import PdFigure
from cpkv.render.cells import figure_table, human_bytes


def render_pd_figure(console: Console, figure: PdFigure) -> None:
    """The PD figure's tables and headline ratios."""
    pd = figure_table(
        f"PD: bytes each prefill rank sent for the trace (Mooncake, loopback; "
        f"{figure.model}, {figure.row_bytes_per_token} B per token)",
        (
            "level",
            "bytes by rank",
            "writes by rank",
            "busiest share",
            "MiB/s",
            "large write",
            "ceiling",
        ),
    )
    for sent in figure.levels:
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
    if figure.reshard:
        render_reshard(console, figure)


def render_reshard(console: Console, figure: PdFigure) -> None:
    """One row per decode CP size: bytes of every (prefill rank, decode rank) pair,
    descriptors and write calls by prefill rank, throughput and its ratio to the large write."""
    level = figure.reshard[0].level
    table = figure_table(
        f"PD re-shard at level {level}: bytes by (prefill rank, decode rank), one row of "
        "decode ranks per prefill rank",
        ("dcp", "bytes by pair", "descriptors by rank", "writes by rank", "MiB/s", "ratio"),
    )
    for row in figure.reshard:
        pairs = " | ".join(" ".join(human_bytes(b) for b in dests) for dests in row.bytes_by_pair)
        table.add_row(
            str(row.decode_cp_size),
            pairs,
            " ".join(map(str, row.descriptors_by_rank)),
            " ".join(map(str, row.write_calls_by_rank)),
            f"{row.mib_per_second:.0f}",
            f"{row.throughput_ratio:.2f}",
        )
    console.print(table)
