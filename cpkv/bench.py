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

from cpkv.bench_balance import BalanceFigure, balance_figure
from cpkv.bench_bytes import BatchBytes, bytes_by_batch
from cpkv.bench_cp_off import (
    CpOffFigure,
    cp_off_bytes,
    cp_off_time_jobs,
    cp_off_times,
    default_min_tokens,
)
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
    materialized_bytes,
    page_balance,
    step_time_job,
    step_times,
    write_path_bytes,
)
from cpkv.bench_overlap import OverlapFigure, overlap_figure
from cpkv.bench_pd import PdFigure, bench_pd
from cpkv.bench_peer_read import PeerReadBatch, materialize_jobs, peer_read_figure
from cpkv.bench_rollback import RollbackFigure, rollback_figure
from cpkv.loop import HostLoop
from cpkv.runner import Backend, RankJob, run_jobs_on_gloo, run_levels
from cpkv_core.config import CpMode, DeploymentConfig, ModelConfig
from cpkv_core.planning import BatchSpec, RequestSpec, build_host_plan, pages_for_trace
from cpkv_core.runtime import kv_bytes_per_page
from phases import PhaseId


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
    """Time of ``Gate.decide`` per scheduled batch, every registered phase enabled."""
    rows = []
    for bs in sizes:
        batch = synthetic_batch(bs, extend_len=4 * deploy.page_size * deploy.cp_size)
        loop = HostLoop(
            deploy, ALL_PHASES, pages_for_trace([batch], deploy.page_size, deploy.cp_size)
        )
        scheduled = loop.step(batch).scheduled
        repeats = max(20, 20_000 // bs)
        seconds = median_seconds(partial(loop.gate.decide, scheduled), repeats=repeats)
        rows.append(GateTiming(bs, seconds * 1e6))
    return rows


HOST_PLAN_PAGE_SIZE = 64
"""The host-plan figure's page size (NSA models' page), whatever the bench's own."""


@dataclass(frozen=True, slots=True)
class HostPlanTiming:
    """Host planning time of one rank for one batch with long histories."""

    requests: int
    history_tokens: int
    """History per request before the measured batch."""
    extend_tokens: int
    pages: int
    """Page-table entries the batch reads (every request's whole table)."""
    phase: int
    microseconds: float
    """``build_host_plan`` for rank 0, median after a warm-up."""

    @property
    def microseconds_per_page(self) -> float:
        """Host plan time over page-table entries: flat as history grows when O(pages)."""
        return self.microseconds / self.pages


def bench_host_plan(
    deploy: DeploymentConfig,
    histories: Sequence[int] = (4096, 32768, 131072),
    requests: int = 8,
    repeats: int = 20,
) -> list[HostPlanTiming]:
    """``build_host_plan`` of a batch of ``requests`` continuing requests, each with
    ``history`` tokens already cached, at page 64 and ``deploy``'s CP size, every phase
    enabled (the gate picks the plan)."""
    deploy = deploy.model_copy(update={"page_size": HOST_PLAN_PAGE_SIZE})
    extend = 2 * deploy.cp_size * deploy.page_size
    rows = []
    for history in histories:
        first = BatchSpec(0, tuple(RequestSpec(f"r{i}", 0, history) for i in range(requests)))
        second = BatchSpec(1, tuple(RequestSpec(f"r{i}", history, extend) for i in range(requests)))
        pages = pages_for_trace([first, second], deploy.page_size, deploy.cp_size)
        loop = HostLoop(deploy, ALL_PHASES, pages)
        loop.step(first)
        step = loop.step(second)
        plan = partial(build_host_plan, step.scheduled, step.decision.plan, 0)
        seconds = median_seconds(plan, repeats=repeats)
        entries = sum(len(r.page_table) for r in step.scheduled.requests)
        rows.append(
            HostPlanTiming(requests, history, extend, entries, step.decision.phase, seconds * 1e6)
        )
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
            pages = pages_for_trace([batch], 16, cp_size)
            job = RankJob(
                model, deploy, (batch,), (0, 1), pages, frozenset({PhaseId.NARROW_OUTPUT})
            )
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
            **self.balance.to_json(),
        }


def run_bench(
    model: ModelConfig,
    deploy: DeploymentConfig,
    batches: Sequence[BatchSpec],
    repeats: int = 3,
    warnings: Sequence[str] = (),
    debug_checks: bool = False,
    on_step: Callable[[str], None] | None = None,
    device: str = "cpu",
    cp_min_tokens: int | None = None,
) -> BenchReport:
    """Runs every figure on ``batches`` (the built-in trace by default in the CLI);
    ``on_step`` hears the name of each figure as it starts. ``cp_min_tokens`` is the minimum
    of the ``cp_off`` bytes (default: the trace's median batch size)."""

    def step(name: str) -> None:
        if on_step is not None:
            on_step(name)

    step("gate decision time")
    gate = bench_gate(deploy)
    step("host plan time, 8 requests x 4K/32K/128K history")
    host_plan = bench_host_plan(deploy)
    step("phase-1 tail bytes")
    tail = bench_tail_bytes(model)
    step("per-rank KV bytes, cp 2/4/8")
    share = bench_kv_share(model, batches, deploy.page_size, (2, 4, 8))
    step("slot vs unique remap")
    remaps = bench_remaps(model, repeats=max(5, 5 * repeats))
    step(f"rollback save copy vs batch time, levels 0/2/5, {deploy.cp_size} in-process ranks")
    rollback = rollback_figure(model, deploy, batches, repeats, device=device)
    min_tokens = default_min_tokens(batches) if cp_min_tokens is None else cp_min_tokens
    step(f"CP off: bytes of batches below {min_tokens} tokens, CP on vs off")
    off_bytes = cp_off_bytes(model, deploy, batches, min_tokens, device=device)
    step(
        f"step time of levels 0-5, CP on vs off by batch size, gather vs peer-read, and "
        f"prefetch off vs on, on {deploy.cp_size} gloo ranks"
    )
    levels = tuple(range(6))
    step_job = step_time_job(model, deploy, batches, levels, repeats, debug_checks, device)
    off_jobs = cp_off_time_jobs(model, deploy, repeats, levels[-1], device=device)
    view_jobs = materialize_jobs(model, deploy, repeats, device)
    # NOTE: one gloo group for every timing: a spawn costs seconds.
    group_runs = run_jobs_on_gloo([step_job, *off_jobs, *view_jobs])
    times, runs = step_times(levels, repeats, group_runs[0])
    off_end = 1 + len(off_jobs)
    off_times = cp_off_times(off_jobs, group_runs[1:off_end])
    view_runs = [job_runs[0] for job_runs in group_runs[off_end:]]
    page_bytes = kv_bytes_per_page(model, deploy.index_k_dtype, deploy.page_size)
    balance = balance_figure(model, deploy, batches, device, step)
    step(f"PD: {deploy.cp_size} prefill ranks -> decode over Mooncake loopback")
    pd = bench_pd(model, deploy, batches, (0, 2, 5))
    return BenchReport(
        gate=gate,
        host_plan=host_plan,
        tail_bytes=tail,
        kv_share=share,
        materialized=materialized_bytes([runs[2], runs[3]], batches),
        write_path=[row for row in write_path_bytes(runs) if row.level >= 2],
        bytes_by_batch=bytes_by_batch(runs),
        page_balance=page_balance(runs, page_bytes),
        pd=pd,
        remaps=remaps,
        step_time=times,
        step_time_cp_size=deploy.cp_size,
        cp_off=CpOffFigure(min_tokens, deploy.cp_size, off_bytes, off_times, levels[-1]),
        warnings=list(warnings),
        peer_read=peer_read_figure(model, view_runs, deploy),
        overlap=overlap_figure(view_runs, deploy.cp_size),
        rollback=rollback,
        balance=balance,
    )
