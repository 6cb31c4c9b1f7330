"""Every figure of one ``cpkv bench`` run as one report, and its JSON document."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cpkv.bench.balance import BalanceFigure
from cpkv.bench.bytes import BatchBytes, WritePathBytes
from cpkv.bench.cp_off import (
    CpOffFigure,
)
from cpkv.bench.host import GateTiming, HostPlanTiming, TailBytes
from cpkv.bench.kv import KvShare, MaterializedBytes, PageBalance, RemapCost, StepTime
from cpkv.bench.overlap import OverlapFigure
from cpkv.bench.pd_figure import PdFigure
from cpkv.bench.peer_read import PeerReadBatch
from cpkv.bench.rollback import RollbackFigure
from cpkv.bench.sglang_plugin import SglangPluginFigure


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Every figure of one bench run."""

    gate: list[GateTiming]
    host_plan: list[HostPlanTiming]
    tail_bytes: list[TailBytes]
    kv_share: list[KvShare]
    materialized: list[MaterializedBytes]
    remaps: list[RemapCost]
    write_path: list[WritePathBytes]
    bytes_by_batch: list[BatchBytes]
    page_balance: list[PageBalance]
    pd: PdFigure
    step_time: list[StepTime]
    step_time_cp_size: int
    cp_off: CpOffFigure
    warnings: list[str]
    peer_read: list[PeerReadBatch]
    overlap: OverlapFigure
    rollback: RollbackFigure
    balance: BalanceFigure
    sglang_plugin: SglangPluginFigure = field(default_factory=SglangPluginFigure)

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``cpkv bench --json``."""
        return {
            "warnings": self.warnings,
            "gate": [asdict(row) for row in self.gate],
            "host_plan": [
                asdict(row) | {"microseconds_per_page": row.microseconds_per_page}
                for row in self.host_plan
            ],
            "tail_bytes": [asdict(row) | {"ratio": row.ratio} for row in self.tail_bytes],
            "kv_share": [
                asdict(row)
                | {
                    "max_fraction": row.max_fraction,
                    "target_fraction": 1 / row.cp_size,
                    "within_target": row.within_target,
                }
                for row in self.kv_share
            ],
            "materialized": [asdict(row) for row in self.materialized],
            "remaps": [asdict(row) for row in self.remaps],
            "write_path": [
                asdict(row) | {"write_path_bytes": row.write_path_bytes} for row in self.write_path
            ],
            "bytes_by_batch": [asdict(row) | {"total": row.total} for row in self.bytes_by_batch],
            "page_balance": [
                asdict(row) | {"max_over_min": row.max_over_min} for row in self.page_balance
            ],
            "pd": self.pd.to_json(),
            "step_time": {
                "cp_size": self.step_time_cp_size,
                "backend": "gloo",
                "levels": [asdict(row) for row in self.step_time],
            },
            "cp_off": self.cp_off.to_json(),
            "peer_read": {
                "level": 2,
                "cp_size": self.step_time_cp_size,
                "backend": "gloo",
                "batches": [row.to_json() for row in self.peer_read],
            },
            "overlap": self.overlap.to_json(),
            "rollback": self.rollback.to_json(),
            "sglang_plugin": self.sglang_plugin.to_json(),
            **self.balance.to_json(),
        }
