"""The ``peer_read`` and ``overlap`` tables of ``cpkv bench``: gather vs peer-read per batch,
and exposed materialization time without and with prefetch, at level 2."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from cpkv.bench.overlap import OverlapFigure
from cpkv.bench.peer_read import PeerReadBatch
from cpkv.render.cells import figure_table


def render_peer_read(console: Console, rows: Sequence[PeerReadBatch], cp_size: int) -> None:
    """One line per batch: history, collective and copied bytes of both modes, time ratio."""
    table = figure_table(
        f"level 2 materialization on {cp_size} gloo ranks: gather vs peer-read (rank 0)",
        (
            "batch",
            "history tok",
            "collective B gather",
            "collective B peer",
            "view gather B gather",
            "view gather B peer",
            "copied B gather",
            "copied B peer",
            "time gather/peer",
        ),
    )
    for row in rows:
        gather, peer = row.gather, row.peer_read
        table.add_row(
            str(row.batch),
            str(row.history_tokens),
            f"{sum(gather.collective_bytes.values()):,}",
            f"{sum(peer.collective_bytes.values()):,}",
            f"{gather.materialize_bytes:,}",
            f"{peer.materialize_bytes:,}",
            f"{gather.copied_bytes:,}",
            f"{peer.copied_bytes:,}",
            f"{row.time_ratio:.2f}",
        )
    console.print(table)


def render_overlap(console: Console, figure: OverlapFigure) -> None:
    """Exposed materialization and step time of the trace, without and with prefetch."""
    table = figure_table(
        f"level 2 gather on {figure.cp_size} gloo ranks, {figure.batches} batches: "
        "exposed materialization without vs with prefetch (median)",
        ("prefetch", "exposed s", "step s"),
    )
    for label, exposed, step in zip(
        ("off", "on"), figure.exposed_seconds, figure.step_seconds, strict=True
    ):
        table.add_row(label, f"{exposed:.4f}", f"{step:.4f}")
    console.print(table)
    console.print(f"exposed with / without prefetch: {figure.exposed_ratio:.2f}", highlight=False)
