"""Every figure of one ``cpkv bench`` run as one report, and its JSON document (a run of some
sections, ``--only``, has the figures of those alone)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from cpkv.bench.balance import BalanceFigure
from cpkv.bench.bytes import BatchBytes, WritePathBytes
from cpkv.bench.cp_off import CpOffFigure
from cpkv.bench.host import GateTiming, HostPlanTiming, TailBytes
from cpkv.bench.kv import KvShare, MaterializedBytes, PageBalance, RemapCost, StepTime
from cpkv.bench.overlap import OverlapFigure
from cpkv.bench.pd_figure import PdFigure
from cpkv.bench.peer_read import PeerReadBatch
from cpkv.bench.rollback import RollbackFigure
from cpkv.bench.sglang_plugin import SglangPluginFigure


@dataclass(frozen=True, slots=True)
class BenchReport:
    """The figures of one bench run; None where the run left a section out."""

    step_time_cp_size: int
    """The gloo figures' CP size (the deployment's)."""
    warnings: list[str]
    gate: list[GateTiming] | None = None
    host_plan: list[HostPlanTiming] | None = None
    tail_bytes: list[TailBytes] | None = None
    kv_share: list[KvShare] | None = None
    materialized: list[MaterializedBytes] | None = None
    remaps: list[RemapCost] | None = None
    write_path: list[WritePathBytes] | None = None
    bytes_by_batch: list[BatchBytes] | None = None
    page_balance: list[PageBalance] | None = None
    pd: PdFigure | None = None
    step_time: list[StepTime] | None = None
    cp_off: CpOffFigure | None = None
    peer_read: list[PeerReadBatch] | None = None
    overlap: OverlapFigure | None = None
    rollback: RollbackFigure | None = None
    balance: BalanceFigure | None = None
    sglang_plugin: SglangPluginFigure | None = None
    section_seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each section run (``suite.run_bench``)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``cpkv bench --json``: every figure the run has."""
        doc: dict[str, Any] = {"warnings": self.warnings}
        for key, (name, part) in _PARTS.items():
            if getattr(self, name) is not None:
                doc[key] = part(self)
        if self.balance is not None:
            doc |= self.balance.to_json()
        doc["section_seconds"] = self.section_seconds
        return doc


def _rows(name: str, extra: Callable[[Any], dict[str, Any]] | None = None) -> Any:
    """A figure that is a list of dataclass rows, each with ``extra``'s properties added."""

    def part(report: BenchReport) -> list[dict[str, Any]]:
        return [asdict(row) | (extra(row) if extra else {}) for row in getattr(report, name)]

    return part


def _kv_share(row: KvShare) -> dict[str, Any]:
    return {
        "max_fraction": row.max_fraction,
        "target_fraction": 1 / row.cp_size,
        "within_target": row.within_target,
    }


def _step_time(report: BenchReport) -> dict[str, Any]:
    levels = [asdict(row) for row in report.step_time or ()]
    return {"cp_size": report.step_time_cp_size, "backend": "gloo", "levels": levels}


def _peer_read(report: BenchReport) -> dict[str, Any]:
    batches = [row.to_json() for row in report.peer_read or ()]
    return {"level": 2, "cp_size": report.step_time_cp_size, "backend": "gloo", "batches": batches}


def _to_json(name: str) -> Callable[[BenchReport], Any]:
    return lambda report: getattr(report, name).to_json()


_PARTS: dict[str, tuple[str, Callable[[BenchReport], Any]]] = {
    "gate": ("gate", _rows("gate")),
    "host_plan": (
        "host_plan",
        _rows("host_plan", lambda r: {"microseconds_per_page": r.microseconds_per_page}),
    ),
    "tail_bytes": ("tail_bytes", _rows("tail_bytes", lambda r: {"ratio": r.ratio})),
    "kv_share": ("kv_share", _rows("kv_share", _kv_share)),
    "materialized": ("materialized", _rows("materialized")),
    "remaps": ("remaps", _rows("remaps")),
    "write_path": (
        "write_path",
        _rows("write_path", lambda r: {"write_path_bytes": r.write_path_bytes}),
    ),
    "bytes_by_batch": ("bytes_by_batch", _rows("bytes_by_batch", lambda r: {"total": r.total})),
    "page_balance": (
        "page_balance",
        _rows("page_balance", lambda r: {"max_over_min": r.max_over_min}),
    ),
    "pd": ("pd", _to_json("pd")),
    "step_time": ("step_time", _step_time),
    "cp_off": ("cp_off", _to_json("cp_off")),
    "peer_read": ("peer_read", _peer_read),
    "overlap": ("overlap", _to_json("overlap")),
    "rollback": ("rollback", _to_json("rollback")),
    "sglang_plugin": ("sglang_plugin", _to_json("sglang_plugin")),
}
"""Every document key but the balance figure's (which brings its own keys): the report
field it comes from and how it is written, in the document's order."""
