"""Phase 2, sharded KV: each rank stores only the pages it owns.

Persistent MLA latent KV and index K/scale are sharded by page ownership
(``owner = page % cp_size``, local physical page ``page // cp_size``): after the current
chunk's all-gather each rank writes only the tokens of pages it owns. Kernels keep reading a
full view: every batch materializes the pages its requests read from their owners, each
distinct page once (compact unique remap: a prefix page shared by several requests of the
batch is gathered once; ``docs/real-rows.md`` measures it against one slot per
page-table entry). There is no per-batch fallback: once
the layout is on, KV at rest is sharded.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Self

from cpkv_core.config import DeploymentConfig, TransferBackend
from cpkv_core.planning import ExecutionPlan, KvReadStrategy, KvWriteStrategy, ScheduledBatch
from phases.base import StartupContract
from phases.ids import PhaseId
from phases.reasons import Reason


class ShardedKVStartup(StartupContract):
    """Sharded KV needs a PD transfer that moves owned pages with their logical positions.

    Any decode CP size is served: the prefill ranks re-shard their owned pages to the
    decode ranks that own them (``planning.pd_reshard``), a non-CP decode server (1)
    included.
    """

    pd_backend: Literal[TransferBackend.MOONCAKE] | None
    """needs Mooncake (owned-page transfer with logical positions) or no PD"""

    @classmethod
    def from_deployment(cls, deploy: DeploymentConfig) -> Self:
        """See ``StartupContract.from_deployment``."""
        # NOTE: validated, not constructed: the fields are Literal rules a value may break.
        return cls.model_validate({"pd_backend": deploy.pd_backend})


class ShardedKV:
    """Phase 2; see the module docstring."""

    id: PhaseId = PhaseId.SHARDED_KV
    needs: tuple[PhaseId, ...] = ()
    # NOTE: KV at rest stays sharded; an unsplit batch writes its owned pages from its own
    # rows.
    needs_split: bool = False
    startup_contract: ClassVar[type[StartupContract]] = ShardedKVStartup
    summary: str = "shard MLA KV and index K/scale by page owner; read through a full view"

    def check_batch(self, batch: ScheduledBatch, deploy: DeploymentConfig) -> list[Reason]:
        """Never refuses a batch: KV at rest is sharded once the layout is on."""
        return []

    def contribute(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Owner-filtered writes and unique-remapped full-view reads."""
        return dataclasses.replace(
            plan,
            kv_write=KvWriteStrategy.OWNER_FILTERED,
            kv_read=KvReadStrategy.MATERIALIZED_UNIQUE,
        )
