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
class ModeCost:
    """What one batch's level-2 read cost under one materialize mode (rank 0's bytes)."""

    collective_bytes: dict[str, int]
    """All-gathered bytes by collective tag."""
    copied_bytes: int
    """Bytes written into the view (gather: the send slots plus the padded gathered view)
    or the key buffer (peer-read: the unpadded history view plus the current rows)."""
    seconds: float
    """The batch's slowest rank, median over rounds."""

    @property
    def materialize_bytes(self) -> int:
        """The history view's gather (0 under peer-read)."""
        return self.collective_bytes.get("materialize", 0)

    def to_json(self) -> dict[str, Any]:
        """One mode of a ``peer_read.batches`` row."""
        return {
            "collective_bytes": self.collective_bytes,
            "materialize_bytes": self.materialize_bytes,
            "copied_bytes": self.copied_bytes,
            "seconds": self.seconds,
        }


@dataclass(frozen=True, slots=True)
class PeerReadBatch:
    """One batch at level 2, gather vs peer-read."""

    batch: int
    history_tokens: int
    gather: ModeCost
    peer_read: ModeCost

    @property
    def time_ratio(self) -> float:
        """Gather time over peer-read time (above 1: peer-read is faster)."""
        return self.gather.seconds / self.peer_read.seconds

    def to_json(self) -> dict[str, Any]:
        """One row of ``peer_read.batches``."""
        return {
            "batch": self.batch,
            "history_tokens": self.history_tokens,
            "gather": self.gather.to_json(),
            "peer_read": self.peer_read.to_json(),
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
        costs = {
            mode: ModeCost(
                dict(by_mode[mode][-1].rank_outputs[i][0].gathered_bytes),
                _copied_rows(hosts[mode]) * per_row,
                statistics.median(
                    max(p.seconds for p in run.rank_outputs[i]) for run in by_mode[mode][1:]
                ),
            )
            for mode in MODES
        }
        rows.append(
            PeerReadBatch(
                batch=step.scheduled.batch,
                history_tokens=hosts[MaterializeMode.PEER_READ].history_tokens,
                gather=costs[MaterializeMode.GATHER],
                peer_read=costs[MaterializeMode.PEER_READ],
            )
        )
    return rows
