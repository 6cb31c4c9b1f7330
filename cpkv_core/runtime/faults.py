"""Game-day faults: break one candidate path on purpose, to prove the guards work.

A ``Fault`` names a decision point's optimized strategy and a kind. The data-corrupting
kinds (``row``, ``drop``, ``owner``) are applied to the expanded tensors of every run whose
plan uses that strategy, on every rank, so the fallback path of a shadow comparison stays
correct; every corruption is a device op with host-known sizes (a roll, a slice, an
offset), like the run step itself. The failing kinds hit one rank, the last: ``raise``
raises inside the path and ``nonfinite`` writes a NaN into what passes through it
(``through``). A fault hits every batch that takes its path, or only ``batch``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import torch
from torch import Tensor

from cpkv_core.planning import (
    DecisionPoint,
    ExecutionPlan,
    HostPlan,
    KvReadStrategy,
    KvWriteStrategy,
    OutputStrategy,
    SplitStrategy,
)
from cpkv_core.runtime.device_plan import BatchTensors
from cpkv_core.runtime.failures import PathError
from cpkv_core.runtime.kv_pool import KVRows

__all__ = ["FAILING_KINDS", "FAULT_KINDS", "POINT_OF", "Fault", "FaultKind", "FaultPoint"]


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
    RAISE = "raise"
    """An exception inside the path, on one rank: in the run step's write (direct write),
    key read (current reuse) or tail after its gather (narrow output), whose group stays in
    step; in the host half for the page-aligned split."""
    NONFINITE = "nonfinite"
    """NaNs in the path's values, on one rank: the latent KV the direct write stores, the
    reused key rows' latent KV, the last-token states of the narrow tail."""


V = TypeVar("V", Tensor, KVRows)


def _nan(rows: Tensor) -> Tensor:
    """``rows`` as NaNs (floating rows; others as they are)."""
    return torch.full_like(rows, float("nan")) if rows.dtype.is_floating_point else rows


FAILING_KINDS = frozenset({FaultKind.RAISE, FaultKind.NONFINITE})
"""Kinds that make a batch fail on one rank rather than corrupt its data quietly."""

POINT_OF: dict[FaultPoint, DecisionPoint] = {
    FaultPoint.NARROW_OUTPUT: DecisionPoint.OUTPUT,
    FaultPoint.CURRENT_REUSE: DecisionPoint.KV_READ,
    FaultPoint.PAGE_ALIGNED_SPLIT: DecisionPoint.SPLIT,
    FaultPoint.DIRECT_WRITE: DecisionPoint.KV_WRITE,
}
"""The decision point whose strategy each fault point is."""


FAULT_KINDS: dict[FaultPoint, tuple[FaultKind, ...]] = {
    FaultPoint.NARROW_OUTPUT: (
        FaultKind.OWNER,
        FaultKind.ROW,
        FaultKind.RAISE,
        FaultKind.NONFINITE,
    ),
    FaultPoint.CURRENT_REUSE: (FaultKind.ROW, FaultKind.RAISE, FaultKind.NONFINITE),
    FaultPoint.PAGE_ALIGNED_SPLIT: (FaultKind.ROW, FaultKind.RAISE),
    FaultPoint.DIRECT_WRITE: (
        FaultKind.DROP,
        FaultKind.ROW,
        FaultKind.OWNER,
        FaultKind.RAISE,
        FaultKind.NONFINITE,
    ),
}
"""The kinds each point supports; the first is the default."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault. Invariant: ``kind in FAULT_KINDS[point]``."""

    point: FaultPoint
    kind: FaultKind
    batch: int | None = None
    """The one batch it hits (``PHASE:KIND@BATCH``); None: every batch taking its path."""

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

    def _fires(self, host: HostPlan, batch: int | None) -> bool:
        """A failing kind on this rank (the last) and batch, on a plan taking the path."""
        hits = self.batch is None or batch == self.batch
        last_rank = host.rank == host.cp_size - 1
        return hits and last_rank and self.targets(host.strategies)

    def through(self, point: DecisionPoint, host: HostPlan, batch: int | None, values: V) -> V:
        """``values`` (rows ``[n, ...]``) passing through ``point``'s path of the run step:
        raises there (``raise``) or comes out as NaNs (``nonfinite``: the latent KV of
        rows) when this fault fails that path on this rank and batch; else ``values``."""
        if self.kind not in FAILING_KINDS or POINT_OF[self.point] is not point:
            return values
        if not self._fires(host, batch):
            return values
        if self.kind is FaultKind.RAISE:
            raise PathError(
                point, f"injected fault {self.point}:raise on rank {host.rank} in batch {batch}"
            )
        if isinstance(values, KVRows):
            return KVRows(_nan(values.latent), values.index_k, values.index_k_scale)
        return _nan(values)

    def apply(self, host: HostPlan, t: BatchTensors, batch: int | None = None) -> BatchTensors:
        """``t`` corrupted, when ``host``'s strategies take the faulty path in ``batch``; else
        ``t``. A ``raise`` in the split's path raises here, in the host half."""
        if self.kind in FAILING_KINDS:
            if POINT_OF[self.point] is DecisionPoint.SPLIT:
                self.through(DecisionPoint.SPLIT, host, batch, t.gather_index)
            return t
        if not self.targets(host.strategies) or self.batch not in (None, batch):
            return t
        replace = dataclasses.replace
        if self.point is FaultPoint.NARROW_OUTPUT:
            if self.kind is FaultKind.OWNER:
                # NOTE: each request's row moves to the next rank's part of the gather.
                rows = (t.gathered_last_rows + host.bs) % (host.cp_size * host.bs)
                return replace(t, gathered_last_rows=rows)
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
