"""``cpkv bench``: the performance figures, measured side by side in one run.

Bytes are counted exactly by the communication layer; times are medians over repeats after a
warm-up. Ratios, not absolute times, are the headline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cpkv.bench.balance import balance_figure
from cpkv.bench.bytes import bytes_by_batch, write_path_bytes
from cpkv.bench.cp_off import (
    CpOffFigure,
    cp_off_bytes,
    cp_off_time_jobs,
    cp_off_times,
    default_min_tokens,
)
from cpkv.bench.host import bench_gate, bench_host_plan, bench_tail_bytes
from cpkv.bench.kv import (
    bench_kv_share,
    bench_remaps,
    materialized_bytes,
    page_balance,
    step_time_job,
    step_times,
)
from cpkv.bench.overlap import overlap_figure
from cpkv.bench.pd import bench_pd
from cpkv.bench.peer_read import peer_read_figure
from cpkv.bench.report import BenchReport
from cpkv.bench.rollback import rollback_figure
from cpkv.bench.sglang_plugin import sglang_plugin_figure
from cpkv.bench.views import materialize_jobs
from cpkv.run.runner import run_jobs_on_gloo
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import kv_bytes_per_page


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
    step(f"sglang_plugin: SGLang's tail gather bytes, stock vs plugin, {deploy.cp_size} CPU ranks")
    sglang_plugin = sglang_plugin_figure(deploy.cp_size)
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
        sglang_plugin=sglang_plugin,
    )
