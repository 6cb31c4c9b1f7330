"""PD figure for ``cpkv bench``: bytes each prefill rank sends, and loopback throughput."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv.pd import PdJob, run_pd
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.planning import BatchSpec


@dataclass(frozen=True, slots=True)
class PdBytes:
    """Bytes each prefill rank sent to the decode server for a whole trace, at one level."""

    level: int
    bytes_by_rank: tuple[int, ...]
    write_seconds_by_rank: tuple[float, ...]

    @property
    def max_share(self) -> float:
        """The busiest rank's share of the bytes (``1/cp_size`` is perfect)."""
        return max(self.bytes_by_rank) / max(1, sum(self.bytes_by_rank))

    @property
    def mib_per_second(self) -> float:
        """Loopback throughput: all bytes over the summed write time of all ranks."""
        return sum(self.bytes_by_rank) / max(1e-9, sum(self.write_seconds_by_rank)) / 2**20


def bench_pd(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
) -> list[PdBytes]:
    """Prefills ``batches`` at ``levels`` and sends every request to one decode process."""
    (report,), (runs,) = run_pd(model, [PdJob(deploy, tuple(batches), tuple(levels))])
    if not report.ok:
        raise RuntimeError(f"PD transfer failed in the bench: {report.errors or report.requests}")
    rows = []
    for level, run in zip(levels, runs, strict=True):
        rows.append(
            PdBytes(
                level,
                tuple(sum(s.bytes_sent for s in results) for results in run.pd),
                tuple(sum(s.write_seconds for s in results) for results in run.pd),
            )
        )
    return rows
