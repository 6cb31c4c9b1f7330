"""The ``peer_read`` table of ``cpkv bench``: gather vs peer-read at level 2, per batch."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from cpkv.bench_peer_read import PeerReadBatch


def render_peer_read(console: Console, rows: Sequence[PeerReadBatch], cp_size: int) -> None:
    """One line per batch: history, collective and copied bytes of both modes, time ratio."""
    table = Table(
        title=f"level 2 materialization on {cp_size} gloo ranks: gather vs peer-read (rank 0)"
    )
    for name in (
        "batch",
        "history tok",
        "collective B gather",
        "collective B peer",
        "view gather B gather",
        "view gather B peer",
        "copied B gather",
        "copied B peer",
        "time gather/peer",
    ):
        table.add_column(name, justify="right")
    for row in rows:
        gather, peer = row.gather_collective_bytes, row.peer_read_collective_bytes
        table.add_row(
            str(row.batch),
            str(row.history_tokens),
            f"{sum(gather.values()):,}",
            f"{sum(peer.values()):,}",
            f"{gather.get('materialize', 0):,}",
            f"{peer.get('materialize', 0):,}",
            f"{row.gather_copied_bytes:,}",
            f"{row.peer_read_copied_bytes:,}",
            f"{row.time_ratio:.2f}",
        )
    console.print(table)
