"""Bytes moved per batch and level for ``cpkv bench``, split by what each all-gather was for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cpkv.bench.kv import write_path_bytes
from cpkv.run.jobs import LevelRun


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
