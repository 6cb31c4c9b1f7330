"""The ``overlap`` figure of ``cpkv bench``: exposed materialization time at level 2, gather
without and with prefetch, on a history-heavy trace.

Both runs go on the bench's gloo group among ``views.materialize_jobs``'s variants,
in turn round by round, so drift hits both alike.
A batch's exposed time is its slowest rank's ``exposed_materialize_seconds`` (view reads no
compute overlapped); the figure sums it over the trace's batches and takes the median over
rounds. The trace's step time is reported beside it, since prefetch must not buy a lower
exposed time with a slower step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpkv.bench.views import LEVEL, variant_runs
from cpkv.run.jobs import LevelRun
from cpkv_core.config import MaterializeMode


def _exposed(run: LevelRun) -> float:
    return sum(max(p.exposed_materialize_seconds for p in pieces) for pieces in run.rank_outputs)


def _step(run: LevelRun) -> float:
    return sum(max(p.seconds for p in pieces) for pieces in run.rank_outputs)


@dataclass(frozen=True, slots=True)
class OverlapFigure:
    """Exposed materialization and step time of the trace, without and with prefetch."""

    cp_size: int
    batches: int
    exposed_seconds: tuple[float, float]
    """Without, with prefetch: medians over rounds of the summed exposed time."""
    step_seconds: tuple[float, float]
    """Without, with prefetch: medians over rounds of the trace's step time."""

    @property
    def exposed_ratio(self) -> float:
        """With over without prefetch (below 1: prefetch hides materialization)."""
        return self.exposed_seconds[1] / self.exposed_seconds[0]

    def to_json(self) -> dict[str, Any]:
        """The ``overlap`` document of ``cpkv bench --json``."""
        return {
            "level": LEVEL,
            "materialize": str(MaterializeMode.GATHER),
            "cp_size": self.cp_size,
            "backend": "gloo",
            "batches": self.batches,
            "without_prefetch": {
                "exposed_seconds": self.exposed_seconds[0],
                "step_seconds": self.step_seconds[0],
            },
            "with_prefetch": {
                "exposed_seconds": self.exposed_seconds[1],
                "step_seconds": self.step_seconds[1],
            },
            "exposed_ratio": self.exposed_ratio,
        }


def overlap_figure(runs: Sequence[LevelRun], cp_size: int) -> OverlapFigure:
    """From ``materialize_jobs``'s runs (one level run per job, in order): gather without
    (variant 0) and with prefetch (variant 2), warm-up dropped."""
    by_mode = [variant_runs(runs, variant)[1:] for variant in (0, 2)]
    exposed = tuple(statistics.median(_exposed(run) for run in mode) for mode in by_mode)
    step = tuple(statistics.median(_step(run) for run in mode) for mode in by_mode)
    return OverlapFigure(cp_size, len(runs[0].steps), (exposed[0], exposed[1]), (step[0], step[1]))
