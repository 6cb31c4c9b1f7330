"""The ``peer_read`` figure of ``cpkv bench``: gather vs peer-read materialization at level 2.

A history-heavy trace (a few long requests, then short continuations) runs at level 2 on the
bench's gloo group, once per materialize mode per round, the two modes alternating so drift
hits both alike. Per batch: collective bytes by purpose (the history view's ``materialize``
gather goes to 0 under peer-read), the bytes each rank copies into its key buffer (counted
from rank 0's host plan: the send slots and the padded view, or the unpadded history view
plus the current rows), and the median time as a ratio, gather over peer-read.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpkv.bench.views import MODES, variant_runs
from cpkv.run.jobs import LevelRun
from cpkv_core.config import DeploymentConfig, MaterializeMode, ModelConfig
from cpkv_core.planning import HostPlan, build_host_plan
from cpkv_core.runtime import kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class PeerReadBatch:
    """One batch at level 2, gather vs peer-read (rank 0's bytes)."""

    batch: int
    history_tokens: int
    gather_collective_bytes: dict[str, int]
    peer_read_collective_bytes: dict[str, int]
    gather_copied_bytes: int
    """Bytes written into the view: the send slots plus the padded gathered view."""
    peer_read_copied_bytes: int
    """Bytes written into the key buffer: the unpadded history view plus the current rows."""
    gather_seconds: float
    peer_read_seconds: float

    @property
    def time_ratio(self) -> float:
        """Gather time over peer-read time (above 1: peer-read is faster)."""
        return self.gather_seconds / self.peer_read_seconds

    def to_json(self) -> dict[str, Any]:
        """One row of ``peer_read.batches``."""
        return {
            "batch": self.batch,
            "history_tokens": self.history_tokens,
            "gather": {
                "collective_bytes": self.gather_collective_bytes,
                "materialize_bytes": self.gather_collective_bytes.get("materialize", 0),
                "copied_bytes": self.gather_copied_bytes,
                "seconds": self.gather_seconds,
            },
            "peer_read": {
                "collective_bytes": self.peer_read_collective_bytes,
                "materialize_bytes": self.peer_read_collective_bytes.get("materialize", 0),
                "copied_bytes": self.peer_read_copied_bytes,
                "seconds": self.peer_read_seconds,
            },
            "time_ratio": self.time_ratio,
        }


def _copied_rows(host: HostPlan) -> int:
    """Token rows one layer's read copies into a view or key buffer on this rank."""
    if host.view is not None:
        return (host.cp_size + 1) * host.view.max_pages * host.page_size
    if host.peer_view is not None:
        return host.history_tokens + host.num_tokens
    return 0


def peer_read_figure(
    model: ModelConfig, runs: Sequence[LevelRun], deploy: DeploymentConfig
) -> list[PeerReadBatch]:
    """Per batch, from :func:`materialize_jobs`'s runs (one level run per job, in order)."""
    by_mode = {mode: variant_runs(runs, i) for i, mode in enumerate(MODES)}
    per_row = kv_bytes_per_token(model, deploy.index_k_dtype) * model.num_layers
    rows = []
    for i, step in enumerate(by_mode[MaterializeMode.GATHER][-1].steps):
        hosts = {
            mode: build_host_plan(step.scheduled, step.decision.plan, 0, peer_read=peer)
            for mode, peer in zip(MODES, (False, True), strict=True)
        }
        seconds = {
            mode: statistics.median(
                max(p.seconds for p in run.rank_outputs[i]) for run in by_mode[mode][1:]
            )
            for mode in MODES
        }
        gather, peer = (by_mode[mode][-1].rank_outputs[i][0].gathered_bytes for mode in MODES)
        rows.append(
            PeerReadBatch(
                batch=step.scheduled.batch,
                history_tokens=hosts[MaterializeMode.PEER_READ].history_tokens,
                gather_collective_bytes=dict(gather),
                peer_read_collective_bytes=dict(peer),
                gather_copied_bytes=_copied_rows(hosts[MaterializeMode.GATHER]) * per_row,
                peer_read_copied_bytes=_copied_rows(hosts[MaterializeMode.PEER_READ]) * per_row,
                gather_seconds=seconds[MaterializeMode.GATHER],
                peer_read_seconds=seconds[MaterializeMode.PEER_READ],
            )
        )
    return rows
