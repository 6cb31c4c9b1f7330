"""The PD figure of ``cpkv bench``: the bytes and send times of every level, and the headline
throughput ratios to one large write and to the ceiling; then the same at the top level
re-sharded to decode groups of M = 1, M = N and M != N ranks (:mod:`cpkv.bench.pd` measures
it)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

MIB = 2**20


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
    descriptors_by_rank: tuple[int, ...] = ()
    """(source, destination, length) descriptors each rank's write calls carried."""
    bytes_by_pair: tuple[tuple[int, ...], ...] = ()
    """``[prefill rank][decode rank]`` bytes: what each prefill rank wrote to each decode
    rank (one column for a non-CP decode server)."""
    decode_cp_size: int = 1
    """Decode ranks the level was sent to."""

    @property
    def throughput_ratio(self) -> float:
        """This level's send path over its large write."""
        return self.mib_per_second / self.large_write_mib_per_second

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
    reshard: tuple[PdBytes, ...] = ()
    """The top level sent to decode groups of M = 1 (the last of ``levels``), M = N and
    M != N ranks, each measured after its own warm-up run."""

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
            "levels": [_row_json(row) for row in self.levels],
            "by_decode_cp_size": [_row_json(row) for row in self.reshard],
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


def _row_json(row: PdBytes) -> dict[str, Any]:
    return asdict(row) | {
        "max_share": row.max_share,
        "mib_per_second": row.mib_per_second,
        "group_mib_per_second": row.group_mib_per_second,
        "large_write_mib_per_second": row.large_write_mib_per_second,
        "concurrent_mib_per_second": row.concurrent_mib_per_second,
        "concurrent_group_mib_per_second": row.concurrent_group_mib_per_second,
        "throughput_ratio": row.throughput_ratio,
    }
