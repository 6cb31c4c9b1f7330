"""PD figure for ``cpkv bench``: bytes each prefill rank sends, and the send path's
throughput as a ratio to one large-buffer write over the same Mooncake loopback."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv.pd import PdJob, run_pd
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.pd import WriteStats
from cpkv_core.planning import BatchSpec

MIB = 2**20


@dataclass(frozen=True, slots=True)
class PdBytes:
    """Bytes each prefill rank sent to the decode server for a whole trace, at one level."""

    level: int
    bytes_by_rank: tuple[int, ...]
    send_seconds_by_rank: tuple[float, ...]
    """Each rank's summed packing and write time."""
    write_calls_by_rank: tuple[int, ...]
    """``batch_transfer_sync_write`` calls each rank made."""
    group_seconds: float
    """Wall time during which any rank was writing (the union of every rank's flushes)."""
    large_write_bytes: int
    """The baseline after this level: one write of the level's KV bytes..."""
    large_write_seconds: float
    """... and its median time (after a warm-up write)."""
    median_flush_mib_per_second: float
    """Median over every rank's flushes of the flush's bytes over its time: the typical
    write call, as the large write's median is (a loaded machine's stalls land in the
    summed figures, not here)."""

    @property
    def max_share(self) -> float:
        """The busiest rank's share of the bytes (``1/cp_size`` is perfect)."""
        return max(self.bytes_by_rank) / max(1, sum(self.bytes_by_rank))

    @property
    def mib_per_second(self) -> float:
        """Send-path throughput: all bytes over the summed send time of all ranks."""
        return sum(self.bytes_by_rank) / max(1e-9, sum(self.send_seconds_by_rank)) / MIB

    @property
    def group_mib_per_second(self) -> float:
        """The group's throughput: all bytes over the time any rank was writing."""
        return sum(self.bytes_by_rank) / max(1e-9, self.group_seconds) / MIB

    @property
    def large_write_mib_per_second(self) -> float:
        """One ``batch_transfer_sync_write`` of one big registered buffer."""
        return self.large_write_bytes / max(1e-9, self.large_write_seconds) / MIB


@dataclass(frozen=True, slots=True)
class PdFigure:
    """The PD rows of every level, each with the large-write baseline measured after it;
    the headline figures are medians over the levels."""

    levels: tuple[PdBytes, ...]

    @property
    def send_mib_per_second(self) -> float:
        """Median over levels of the send path's throughput (each rank's own time)."""
        return statistics.median(row.mib_per_second for row in self.levels)

    @property
    def group_mib_per_second(self) -> float:
        """Median over levels of the group's throughput (ranks writing at once)."""
        return statistics.median(row.group_mib_per_second for row in self.levels)

    @property
    def large_write_mib_per_second(self) -> float:
        """Median over levels of one large write's throughput."""
        return statistics.median(row.large_write_mib_per_second for row in self.levels)

    @property
    def median_flush_mib_per_second(self) -> float:
        """Median over levels of the typical flush's throughput."""
        return statistics.median(row.median_flush_mib_per_second for row in self.levels)

    @property
    def median_flush_ratio(self) -> float:
        """The typical flush over the large write: both medians, stalls left out of both."""
        return self.median_flush_mib_per_second / self.large_write_mib_per_second

    @property
    def throughput_ratio(self) -> float:
        """Send path over large write (goal: at least 0.5): all ranks' bytes over their
        summed send time, against one writer's one write of the same bytes."""
        return self.send_mib_per_second / self.large_write_mib_per_second

    @property
    def group_throughput_ratio(self) -> float:
        """The group's throughput (ranks writing at once) over the large write."""
        return self.group_mib_per_second / self.large_write_mib_per_second

    def to_json(self) -> dict[str, Any]:
        """The ``pd`` object of ``cpkv bench --json``."""
        return {
            "levels": [
                asdict(row)
                | {
                    "max_share": row.max_share,
                    "mib_per_second": row.mib_per_second,
                    "group_mib_per_second": row.group_mib_per_second,
                    "large_write_mib_per_second": row.large_write_mib_per_second,
                }
                for row in self.levels
            ],
            "send_mib_per_second": self.send_mib_per_second,
            "group_mib_per_second": self.group_mib_per_second,
            "large_write_mib_per_second": self.large_write_mib_per_second,
            "throughput_ratio": self.throughput_ratio,
            "group_throughput_ratio": self.group_throughput_ratio,
            "median_flush_mib_per_second": self.median_flush_mib_per_second,
            "median_flush_ratio": self.median_flush_ratio,
        }


def median_flush_mib_per_second(stats: Sequence[WriteStats]) -> float:
    """Median over the flushes of every rank of bytes over seconds."""
    rates = [
        nbytes / max(1e-9, end - start) / MIB
        for s in stats
        for nbytes, (start, end) in zip(s.flush_bytes, s.spans, strict=True)
        if nbytes
    ]
    return statistics.median(rates) if rates else 0.0


def union_seconds(spans: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def bench_pd(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
) -> PdFigure:
    """Prefills ``batches`` at ``levels``, streaming every request to one decode process;
    after each level, rank 0 times one write of that level's KV bytes to the same server.

    A first run at ``levels[0]`` is a warm-up (it opens the transfer sessions) and is not
    counted.
    """
    job = PdJob(deploy, tuple(batches), (levels[0], *levels), probe=True)
    (report,), (runs,) = run_pd(model, [job])
    if not report.ok:
        raise RuntimeError(f"PD transfer failed in the bench: {report.errors or report.requests}")
    runs = runs[1:]
    rows = []
    for level, run in zip(levels, runs, strict=True):
        probe = run.pd_probe
        assert probe is not None, "rank 0 timed no large write"
        rows.append(
            PdBytes(
                level,
                tuple(sum(s.bytes_sent for s in results) for results in run.pd),
                tuple(stats.seconds for stats in run.pd_stats),
                tuple(stats.calls for stats in run.pd_stats),
                union_seconds([span for stats in run.pd_stats for span in stats.spans]),
                probe.nbytes,
                probe.seconds,
                median_flush_mib_per_second(run.pd_stats),
            )
        )
    return PdFigure(tuple(rows))
