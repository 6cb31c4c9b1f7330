"""Game-day faults: corrupt one candidate path on purpose, to prove the shadow guard works.

A ``Fault`` names a decision point's optimized strategy and a kind of corruption. The engine
applies it to the expanded tensors of every run whose plan uses that strategy, so the
fallback path of a shadow comparison stays correct. Every corruption is a device op with
host-known sizes (a roll, a slice, an offset), like the run step itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from cpkv_core.planning import (
    ExecutionPlan,
    HostPlan,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    SplitStrategy,
)
from cpkv_core.runtime.device_plan import BatchTensors

__all__ = ["FAULT_KINDS", "Fault", "FaultKind", "FaultPoint"]


class FaultPoint(StrEnum):
    """The optimized strategy a fault corrupts."""

    NARROW_OUTPUT = "narrow-output"
    CURRENT_REUSE = "current-reuse"
    PAGE_ALIGNED_SPLIT = "page-aligned-split"
    """Either page-aligned split: the zigzag cut at page boundaries or the page interleave."""
    DIRECT_WRITE = "direct-write"


class FaultKind(StrEnum):
    """How the path is corrupted."""

    ROW = "row"
    """A wrong row: each affected index points at its neighbour's row."""
    DROP = "drop"
    """A dropped write: the last token row of the write is lost."""
    OWNER = "owner"
    """A wrong owner. Narrow output: a last token's state is taken from the next rank's
    contribution. Direct write: each rank takes the first page it computes for another
    rank's (a wrong compute owner) and does not write it, so its owner's pool never holds
    it."""


FAULT_KINDS: dict[FaultPoint, tuple[FaultKind, ...]] = {
    FaultPoint.NARROW_OUTPUT: (FaultKind.OWNER, FaultKind.ROW),
    FaultPoint.CURRENT_REUSE: (FaultKind.ROW,),
    FaultPoint.PAGE_ALIGNED_SPLIT: (FaultKind.ROW,),
    FaultPoint.DIRECT_WRITE: (FaultKind.DROP, FaultKind.ROW, FaultKind.OWNER),
}
"""The kinds each point supports; the first is the default."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault. Invariant: ``kind in FAULT_KINDS[point]``."""

    point: FaultPoint
    kind: FaultKind

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS[self.point]:
            allowed = ", ".join(FAULT_KINDS[self.point])
            raise ValueError(f"fault {self.point} takes kind {allowed}, got {self.kind}")

    def targets(self, plan: ExecutionPlan) -> bool:
        """Whether a run under ``plan`` takes the corrupted path."""
        return {
            FaultPoint.NARROW_OUTPUT: plan.output is OutputStrategy.NARROW_LAST_TOKEN,
            FaultPoint.CURRENT_REUSE: plan.kv_read is KvReadStrategy.CURRENT_REUSE,
            FaultPoint.PAGE_ALIGNED_SPLIT: plan.split
            in (SplitStrategy.PAGE_ALIGNED_ZIGZAG, SplitStrategy.PAGE_INTERLEAVED),
            FaultPoint.DIRECT_WRITE: plan.kv_write is KvWriteStrategy.COMPUTE_OWNER_DIRECT,
        }[self.point]

    def apply(self, host: HostPlan, t: BatchTensors) -> BatchTensors:
        """``t`` corrupted, when ``host``'s strategies take the faulty path; else ``t``."""
        if not self.targets(host.strategies):
            return t
        replace = dataclasses.replace
        if self.point is FaultPoint.NARROW_OUTPUT:
            if self.kind is FaultKind.OWNER:
                return replace(t, last_token_ranks=(t.last_token_ranks + 1) % host.cp_size)
            return replace(t, local_last_rows=(t.local_last_rows + 1) % max(host.num_local, 1))
        if self.point is FaultPoint.CURRENT_REUSE:
            return replace(t, key_rows=t.key_rows.roll(1))
        if self.point is FaultPoint.PAGE_ALIGNED_SPLIT:
            return replace(t, gather_index=t.gather_index.roll(1))
        if self.kind is FaultKind.DROP:
            keep = max(host.num_written - 1, 0)
            return replace(
                t,
                write_source=t.write_source_rows()[:keep],
                write_dest=t.write_dest[:keep],
                written_locs=t.written_locs[:keep],
            )
        if self.kind is FaultKind.OWNER:
            # NOTE: the first write run is this rank's first page; its size is a host int.
            counts = host.table("write_count")
            skip = int(counts[0]) if len(counts) else 0
            return replace(
                t,
                write_source=t.write_source_rows()[skip:],
                write_dest=t.write_dest[skip:],
                written_locs=t.written_locs[skip:],
            )
        return replace(t, write_source=t.write_source_rows().roll(1))
