"""Phase 3, current reuse: current-only batches skip materialization.

When no request of a batch has history, every key a query reads is a current token, which
the all-gather already put on every rank in batch order. The MLA and indexer reads then use
that buffer, remapping each request's logical positions to compact rows, and no view is
built. Batches with any history keep phase 2's materialized reads.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from cpkv_core.config import DeploymentConfig
from cpkv_core.planning import ExecutionPlan, KvReadStrategy, ScheduledBatch
from phases.base import StartupContract
from phases.ids import PhaseId
from phases.reasons import Reason, ReasonCode


class CurrentReuseStartup(StartupContract):
    """Current reuse adds no start-up condition to phase 2's: any split, any page size."""


class CurrentReuse:
    """Phase 3; see the module docstring."""

    id: PhaseId = PhaseId.CURRENT_REUSE
    needs: tuple[PhaseId, ...] = (PhaseId.SHARDED_KV,)
    # NOTE: under the none split a rank's own rows are the whole current chunk.
    needs_split: bool = False
    startup_contract: ClassVar[type[StartupContract]] = CurrentReuseStartup
    summary: str = "current-only batches read the gathered chunk and skip materialization"

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        """Refuses every request that has history, with its prefix length."""
        if not batch.has_history:
            return []
        return [
            Reason(ReasonCode.HAS_HISTORY, (("rid", req.rid), ("prefix_len", req.prefix_len)))
            for req in batch.requests
            if req.prefix_len > 0
        ]

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Reads keys from the gathered current chunk."""
        return dataclasses.replace(plan, kv_read=KvReadStrategy.CURRENT_REUSE)
