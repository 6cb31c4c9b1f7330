"""Bytes moved per batch and level for ``cpkv bench``: the write path's current-KV gather (0 under
phase 5), and every all-gather split by what it was for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv.run.jobs import LevelRun
from cpkv_core.planning import (
    KvReadStrategy,
    KvWriteStrategy,
)


@dataclass(frozen=True, slots=True)
class WritePathBytes:
    """Current-chunk all-gather bytes of one batch at one level (rank 0), and who needs them."""

    level: int
    batch: int
    phase: int
    gathered_bytes: int
    needed_by_write: bool
    needed_by_read: bool

    @property
    def write_path_bytes(self) -> int:
        """Bytes gathered for the KV write; 0 under compute-owner direct writes."""
        return self.gathered_bytes if self.needed_by_write else 0


def write_path_bytes(runs: Sequence[LevelRun]) -> list[WritePathBytes]:
    """Per batch and level: the current-KV gather and whether write or read needed it."""
    rows = []
    for run in runs:
        for i, step in enumerate(run.steps):
            plan = step.decision.plan
            gathers = not plan.computes_every_token  # NOTE: the none split gathers nothing
            tags = run.rank_outputs[i][0].gathered_bytes
            rows.append(
                WritePathBytes(
                    level=run.level,
                    batch=i,
                    phase=step.decision.phase,
                    gathered_bytes=tags.get("current_kv", 0) + tags.get("current_index_k", 0),
                    needed_by_write=gathers
                    and plan.kv_write is not KvWriteStrategy.COMPUTE_OWNER_DIRECT,
                    needed_by_read=gathers and plan.kv_read is KvReadStrategy.CURRENT_REUSE,
                )
            )
    return rows


@dataclass(frozen=True, slots=True)
class BatchBytes:
    """All-gathered bytes rank 0 received for one batch at one level, by purpose.

    Invariant: the four parts add up to every byte the batch all-gathered on rank 0.
    """

    level: int
    batch: int
    phase: int
    """The phase the batch took at this level."""
    write: int
    """The current chunk's KV and index K, gathered because the KV write needs them."""
    current_gather: int
    """The current chunk gathered only for the read (current reuse under a direct write)."""
    materialize: int
    """History pages gathered from their owners into a full view."""
    tail: int
    """Hidden states gathered at the tail (full, or narrow under phase 1)."""

    @property
    def total(self) -> int:
        """Every byte the batch all-gathered on rank 0."""
        return self.write + self.current_gather + self.materialize + self.tail


def bytes_by_batch(runs: Sequence[LevelRun]) -> list[BatchBytes]:
    """From the levels' runs of a trace (rank 0's counted bytes per collective tag)."""
    rows = []
    for row in write_path_bytes(runs):
        run = next(r for r in runs if r.level == row.level)
        tags = run.rank_outputs[row.batch][0].gathered_bytes
        rows.append(
            BatchBytes(
                level=row.level,
                batch=row.batch,
                phase=row.phase,
                write=row.write_path_bytes,
                current_gather=row.gathered_bytes - row.write_path_bytes,
                materialize=tags.get("materialize", 0),
                tail=tags.get("tail_hidden", 0),
            )
        )
    return rows
