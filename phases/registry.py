"""The phases whose mechanics exist; a phase is registered only with its mechanics."""

from __future__ import annotations

from phases.base import Phase
from phases.ids import PhaseId
from phases.p1_narrow_output import NarrowOutput
from phases.p2_sharded_kv import ShardedKV
from phases.p3_current_reuse import CurrentReuse
from phases.p4_page_aligned_split import PageAlignedSplit
from phases.p5_compute_owner_write import ComputeOwnerWrite

REGISTERED_PHASES: dict[PhaseId, Phase] = {
    PhaseId.NARROW_OUTPUT: NarrowOutput(),
    PhaseId.SHARDED_KV: ShardedKV(),
    PhaseId.CURRENT_REUSE: CurrentReuse(),
    PhaseId.PAGE_ALIGNED_SPLIT: PageAlignedSplit(),
    PhaseId.COMPUTE_OWNER_WRITE: ComputeOwnerWrite(),
}
