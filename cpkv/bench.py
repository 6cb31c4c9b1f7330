"""``cpkv bench``: the performance figures, measured side by side in one run.

Bytes are counted exactly by the communication layer; times are medians over repeats after a
warm-up. Ratios, not absolute times, are the headline.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from cpkv.bench_bytes import BatchBytes, bytes_by_batch
from cpkv.bench_kv import (
    ALL_PHASES,
    KvShare,
    MaterializedBytes,
    PageBalance,
    RemapCost,
    StepTime,
    WritePathBytes,
    bench_kv_share,
    bench_remaps,
    bench_step_time,
    materialized_bytes,
    page_balance,
    write_path_bytes,
)
from cpkv.bench_pd import PdBytes, bench_pd
from cpkv.runner import Backend, RankJob, run_levels
from cpkv_core.allocation import pages_for_trace
from cpkv_core.batch import BatchSpec, RequestSpec
from cpkv_core.config import CpMode, DeploymentConfig, ModelConfig
from cpkv_core.kv_pool import kv_bytes_per_page
from phases.gate import Gate, level_plans
from phases.ids import PhaseId
from phases.registry import REGISTERED_PHASES


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def synthetic_batch(bs: int, extend_len: int) -> BatchSpec:
    """A first batch of ``bs`` new requests of ``extend_len`` tokens each."""
    return BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, extend_len) for i in range(bs)))


@dataclass(frozen=True, slots=True)
class GateTiming:
    """Gate decision time for one batch size."""

    bs: int
    microseconds_per_batch: float


def bench_gate(deploy: DeploymentConfig, sizes: Sequence[int] = (1, 32, 256)) -> list[GateTiming]:
    """Time of ``Gate.plan`` per batch, every registered phase enabled."""
    gate = Gate(frozenset(REGISTERED_PHASES), deploy)
    rows = []
    for bs in sizes:
        batch = synthetic_batch(bs, extend_len=4 * deploy.page_size * deploy.cp_size)
        repeats = max(20, 20_000 // bs)
        seconds = median_seconds(partial(gate.plan, batch), repeats=repeats)
        rows.append(GateTiming(bs, seconds * 1e6))
    return rows


@dataclass(frozen=True, slots=True)
class TailBytes:
    """Tail bytes gathered per rank for one batch, full gather (level 0) vs narrow (level 1)."""

    cp_size: int
    cp_mode: str
    bs: int
    tokens: int
    full_gather_bytes: int
    narrow_bytes: int

    @property
    def ratio(self) -> float:
        """narrow / full."""
        return self.narrow_bytes / self.full_gather_bytes


def bench_tail_bytes(
    model: ModelConfig, cp_sizes: Sequence[int] = (2, 4, 8), bs: int = 8, extend_len: int = 96
) -> list[TailBytes]:
    """Runs one batch at levels 0 and 1 on the in-process group and reads the counted bytes."""
    rows = []
    batch = synthetic_batch(bs, extend_len)
    for cp_size in cp_sizes:
        for cp_mode in CpMode:
            deploy = DeploymentConfig(cp_size=cp_size, cp_mode=cp_mode, page_size=16)
            plans = tuple(
                tuple(
                    p.plan
                    for p in level_plans(lv, frozenset({PhaseId.NARROW_OUTPUT}), deploy, [batch])
                )
                for lv in (0, 1)
            )
            job = RankJob(model, deploy, (batch,), plans, pages_for_trace([batch], 16, cp_size))
            full, narrow = (
                run.rank_outputs[0][0].gathered_bytes["tail_hidden"]
                for run in run_levels(job, Backend.LOCAL)
            )
            rows.append(TailBytes(cp_size, str(cp_mode), bs, batch.num_tokens, full, narrow))
    return rows


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Every figure of one bench run."""

    gate: list[GateTiming]
    tail_bytes: list[TailBytes]
    kv_share: list[KvShare]
    materialized: list[MaterializedBytes]
    remaps: list[RemapCost]
    write_path: list[WritePathBytes]
    bytes_by_batch: list[BatchBytes]
    page_balance: list[PageBalance]
    pd: list[PdBytes]
    step_time: list[StepTime]
    step_time_cp_size: int
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``cpkv bench --json``."""
        return {
            "warnings": self.warnings,
            "gate": [asdict(row) for row in self.gate],
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
            "pd": [
                asdict(row) | {"max_share": row.max_share, "mib_per_second": row.mib_per_second}
                for row in self.pd
            ],
            "step_time": {
                "cp_size": self.step_time_cp_size,
                "backend": "gloo",
                "levels": [asdict(row) for row in self.step_time],
            },
        }


def run_bench(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    repeats: int = 3,
    warnings: Sequence[str] = (),
    debug_checks: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> BenchReport:
    """Runs every figure on ``batches`` (the built-in trace by default in the CLI);
    ``on_step`` hears the name of each figure as it starts."""

    def step(name: str) -> None:
        if on_step is not None:
            on_step(name)

    step("gate decision time")
    gate = bench_gate(deploy)
    step("phase-1 tail bytes")
    tail = bench_tail_bytes(model)
    step("per-rank KV bytes, cp 2/4/8")
    share = bench_kv_share(model, batches, deploy.page_size, (2, 4, 8))
    step("slot vs unique remap")
    remaps = bench_remaps(model, repeats=max(5, 5 * repeats))
    step(f"step time of levels 0-5 on {deploy.cp_size} gloo ranks")
    levels = tuple(range(6))
    times, results = bench_step_time(model, deploy, batches, levels, repeats, debug_checks)
    chosen = [[p.phase for p in level_plans(lv, ALL_PHASES, deploy, batches)] for lv in levels]
    page_bytes = kv_bytes_per_page(model, deploy.index_k_dtype, deploy.page_size)
    step(f"PD: {deploy.cp_size} prefill ranks -> decode over Mooncake loopback")
    pd = bench_pd(model, deploy, batches, (0, 2, 5))
    return BenchReport(
        gate=gate,
        tail_bytes=tail,
        kv_share=share,
        materialized=materialized_bytes([results[2].run, results[3].run], batches),
        write_path=[row for row in write_path_bytes(results, chosen) if row.level >= 2],
        bytes_by_batch=bytes_by_batch(results, chosen),
        page_balance=page_balance(results, page_bytes),
        pd=pd,
        remaps=remaps,
        step_time=times,
        step_time_cp_size=deploy.cp_size,
        warnings=list(warnings),
    )
