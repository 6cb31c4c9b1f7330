"""PD figure for ``cpkv bench``: bytes each prefill rank sends, and the send path's
throughput as a ratio to one large-buffer write over the same Mooncake loopback.

Measured on the bench's model widened to DeepSeek-V3.2's KV rows (``pd_model``): what limits
a write is its size, and the size of a rank's write is set by the bytes of a token row. Next
to the send path, every rank writes its share in one call at once (the ceiling): the same
throughput statistic for the best sender this transport allows at this CP size here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv.run.pd import PdJob, run_pd
from cpkv_core.config import DeploymentConfig, ModelConfig, model_preset
from cpkv_core.pd import ConcurrentWrite, WriteStats
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import kv_bytes_per_page

MIB = 2**20

ROWS_OF = "deepseek-v3.2"
"""The model whose KV row widths the PD figure uses."""


def pd_model(model: ModelConfig, rows_of: str = ROWS_OF) -> ModelConfig:
    """``model`` with the latent, rope and index-key widths of ``rows_of``: the same layers
    and compute, a real model's bytes per token row per layer."""
    real = model_preset(rows_of)
    return model.model_copy(
        update={
            "name": f"{model.name}-{rows_of}-rows",
            "kv_lora_rank": real.kv_lora_rank,
            "qk_rope_head_dim": real.qk_rope_head_dim,
            "index_head_dim": real.index_head_dim,
        }
    )


@dataclass(frozen=True, slots=True)
class PdBytes:
    """Bytes each prefill rank sent to the decode server for a whole trace, at one level."""

    level: int
    bytes_by_rank: tuple[int, ...]
    send_seconds_by_rank: tuple[float, ...]
    """Each rank's summed packing and write time."""
    exposed_seconds_by_rank: tuple[float, ...]
    """The part of it each rank's prefill loop waited for (``WriteStats.exposed_seconds``:
    packing, waiting for a free staging buffer, the final drain)."""
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
    concurrent_write_bytes: int
    """The ceiling after the large write: every rank writes its share of the level's KV
    bytes in one call, at once (``concurrent_write_bytes`` in all) ..."""
    concurrent_write_seconds: float
    """... median over repeats of the ranks' summed write times (as the send path's) ..."""
    concurrent_group_seconds: float
    """... and median over repeats of the time any rank was writing."""

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

    @property
    def concurrent_mib_per_second(self) -> float:
        """The ceiling's throughput, by the send path's statistic (summed rank time)."""
        return self.concurrent_write_bytes / max(1e-9, self.concurrent_write_seconds) / MIB

    @property
    def concurrent_group_mib_per_second(self) -> float:
        """The ceiling's throughput, by the group statistic (time any rank was writing)."""
        return self.concurrent_write_bytes / max(1e-9, self.concurrent_group_seconds) / MIB


@dataclass(frozen=True, slots=True)
class PdFigure:
    """The PD rows of every level, each with the large-write baseline measured after it;
    the headline figures are medians over the levels."""

    levels: tuple[PdBytes, ...]
    model: str
    """The model measured (the bench's, with ``ROWS_OF``'s row widths)."""
    row_bytes_per_token: int
    """KV bytes of one token, every layer (latent, index K and scale)."""

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

    @property
    def ceiling_ratio(self) -> float:
        """``throughput_ratio`` of the best sender here: every rank writing its share in one
        call at once, over the large write (medians over levels). Whatever a sender does,
        ``cp_size`` writers on this machine get about this much."""
        return (
            statistics.median(row.concurrent_mib_per_second for row in self.levels)
            / self.large_write_mib_per_second
        )

    @property
    def group_ceiling_ratio(self) -> float:
        """``group_throughput_ratio`` of the same best sender."""
        return (
            statistics.median(row.concurrent_group_mib_per_second for row in self.levels)
            / self.large_write_mib_per_second
        )

    @property
    def exposed_fraction(self) -> float:
        """Median over levels of all ranks' exposed time over their summed send time: the
        share of the send path the prefill loops waited for (1.0 with overlap off)."""
        return statistics.median(
            sum(row.exposed_seconds_by_rank) / max(1e-9, sum(row.send_seconds_by_rank))
            for row in self.levels
        )

    @property
    def of_ceiling(self) -> float:
        """The send path's share of the ceiling: ``throughput_ratio / ceiling_ratio``."""
        return self.throughput_ratio / self.ceiling_ratio

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
                    "concurrent_mib_per_second": row.concurrent_mib_per_second,
                    "concurrent_group_mib_per_second": row.concurrent_group_mib_per_second,
                }
                for row in self.levels
            ],
            "model": self.model,
            "row_bytes_per_token": self.row_bytes_per_token,
            "send_mib_per_second": self.send_mib_per_second,
            "group_mib_per_second": self.group_mib_per_second,
            "large_write_mib_per_second": self.large_write_mib_per_second,
            "throughput_ratio": self.throughput_ratio,
            "group_throughput_ratio": self.group_throughput_ratio,
            "median_flush_mib_per_second": self.median_flush_mib_per_second,
            "median_flush_ratio": self.median_flush_ratio,
            "ceiling_ratio": self.ceiling_ratio,
            "group_ceiling_ratio": self.group_ceiling_ratio,
            "of_ceiling": self.of_ceiling,
            "exposed_fraction": self.exposed_fraction,
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


def concurrent_seconds(writes: Sequence[ConcurrentWrite]) -> tuple[float, float]:
    """(median over repeats of the ranks' summed write times, median over repeats of the
    time any rank was writing) of the group's concurrent writes."""
    rounds = list(zip(*(w.spans for w in writes), strict=True))
    summed = [sum(end - start for start, end in spans) for spans in rounds]
    union = [union_seconds(spans) for spans in rounds]
    return statistics.median(summed), statistics.median(union)


def bench_pd(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    levels: Sequence[int],
    overlap: bool = True,
) -> PdFigure:
    """Prefills ``batches`` at ``levels`` on ``pd_model(model)``, streaming every request to
    one decode process; after each level, rank 0 times one write of that level's KV bytes to
    the same server, then every rank writes its share in one call at once.

    A first run at ``levels[0]`` is a warm-up (it opens the transfer sessions) and is not
    counted. ``overlap`` False makes the ranks write synchronously (``PdJob.overlap``).
    """
    measured = pd_model(model)
    job = PdJob(deploy, tuple(batches), (levels[0], *levels), probe=True, overlap=overlap)
    (report,), (runs,) = run_pd(measured, [job])
    if not report.ok:
        raise RuntimeError(f"PD transfer failed in the bench: {report.errors or report.requests}")
    runs = runs[1:]
    rows = []
    for level, run in zip(levels, runs, strict=True):
        probe = run.pd_probe
        assert probe is not None and run.pd_concurrent, "the ranks timed no large writes"
        summed, group = concurrent_seconds(run.pd_concurrent)
        rows.append(
            PdBytes(
                level,
                tuple(sum(s.bytes_sent for s in results) for results in run.pd),
                tuple(stats.seconds for stats in run.pd_stats),
                tuple(stats.exposed_seconds for stats in run.pd_stats),
                tuple(stats.calls for stats in run.pd_stats),
                union_seconds([span for stats in run.pd_stats for span in stats.spans]),
                probe.nbytes,
                probe.seconds,
                median_flush_mib_per_second(run.pd_stats),
                sum(w.nbytes for w in run.pd_concurrent),
                summed,
                group,
            )
        )
    token_bytes = kv_bytes_per_page(measured, deploy.index_k_dtype, 1)
    return PdFigure(tuple(rows), measured.name, token_bytes)
