"""The sections of ``cpkv bench``, one entry each in ``SECTIONS``: the name ``--only`` takes,
what it measures (its progress line) and the function that measures it.

A section's function takes the run's ``BenchInputs``. An in-process section measures there
and returns its figures, as ``BenchReport`` fields by name. A section on gloo ranks returns
a ``GroupPart`` instead, most simply a generator that does its in-process part, yields its
rank jobs, is sent their runs and returns its figures. ``suite.run_bench`` calls the
functions in the table's order, then takes every part's jobs (the generators run up to their
yield then, in the same order), runs them all in ONE spawned group (a spawn costs seconds a
rank) and finishes each part on its runs.

So what a gloo section's function starts before it returns runs beside the sections after
it in the table: the SGLang plugin's section starts its measuring process that way, first of
all (it counts bytes, so the other work beside it changes none of its figures), and the PD
section starts its decode processes after the sections that time in-process work (gate,
host plan, remaps, rollback) and before those that only count bytes. To add a section,
write its function and add one entry where it belongs.
"""

from __future__ import annotations

from cpkv.bench.balance import balance_figure
from cpkv.bench.bytes import bytes_by_batch, write_path_bytes
from cpkv.bench.cp_off import (
    CpOffFigure,
    cp_off_bytes_jobs,
    cp_off_bytes_rows,
    cp_off_time_jobs,
    cp_off_times,
    default_min_tokens,
)
from cpkv.bench.host import bench_gate, bench_host_plan, bench_tail_bytes
from cpkv.bench.kv import (
    bench_remaps,
    kv_share_job,
    kv_share_row,
    materialized_bytes,
    page_balance,
    step_time_jobs,
    step_times,
)
from cpkv.bench.overlap import overlap_figure
from cpkv.bench.pd import PdPart
from cpkv.bench.peer_read import peer_read_figure
from cpkv.bench.rollback import rollback_figure
from cpkv.bench.section import (
    BenchInputs,
    Figures,
    GroupPart,
    GroupRuns,
    Section,
    SectionGenerator,
)
from cpkv.bench.sglang_plugin import SglangPluginRun
from cpkv.bench.views import materialize_jobs
from cpkv.run.jobs import Backend, RankJob
from cpkv.run.runner import run_levels
from cpkv_core.runtime import kv_bytes_per_page

__all__ = ["SECTIONS", "section_names"]


class _PdSection:
    """The PD figure's part (``bench.pd.PdPart``) under its report field."""

    def __init__(self, part: PdPart) -> None:
        self.part = part

    def jobs(self) -> list[RankJob]:
        return self.part.jobs()

    def finish(self, runs: GroupRuns) -> Figures:
        return {"pd": self.part.finish(runs)}

    def close(self) -> None:
        self.part.close()


def _gate(inputs: BenchInputs) -> Figures:
    return {"gate": bench_gate(inputs.deploy)}


def _host_plan(inputs: BenchInputs) -> Figures:
    return {"host_plan": bench_host_plan(inputs.deploy)}


def _tail_bytes(inputs: BenchInputs) -> Figures:
    return {"tail_bytes": bench_tail_bytes(inputs.model)}


KV_SHARE_CP_SIZES = (2, 4, 8)
"""The CP sizes of ``kv_share``: those up to the deployment's on the gloo group, the rest on
in-process ranks (a group sized for them would start ranks only they use)."""


def _kv_share(inputs: BenchInputs) -> SectionGenerator:
    page_size, cp = inputs.deploy.page_size, inputs.deploy.cp_size
    jobs = [kv_share_job(inputs.model, inputs.batches, page_size, n) for n in KV_SHARE_CP_SIZES]
    alone = {j.deploy.cp_size: j for j in jobs if j.deploy.cp_size > cp}
    rows = {n: kv_share_row(job, run_levels(job, Backend.LOCAL)) for n, job in alone.items()}
    grouped = [job for job in jobs if job.deploy.cp_size <= cp]
    runs = yield grouped
    rows |= {job.deploy.cp_size: kv_share_row(job, r) for job, r in zip(grouped, runs, strict=True)}
    return {"kv_share": [rows[n] for n in KV_SHARE_CP_SIZES]}


def _remaps(inputs: BenchInputs) -> Figures:
    return {"remaps": bench_remaps(inputs.model, repeats=max(5, 5 * inputs.repeats))}


def _rollback(inputs: BenchInputs) -> Figures:
    figure = rollback_figure(
        inputs.model, inputs.deploy, inputs.batches, inputs.repeats, device=inputs.device
    )
    return {"rollback": figure}


LEVELS = tuple(range(6))
"""The levels the step time runs (and ``cp_off`` at the last of them)."""


def _step_time(inputs: BenchInputs) -> SectionGenerator:
    model, deploy, batches = inputs.model, inputs.deploy, inputs.batches
    jobs = step_time_jobs(
        model, deploy, batches, LEVELS, inputs.repeats, inputs.debug_checks, inputs.device
    )
    _, timed = yield jobs
    times, runs = step_times(LEVELS, inputs.repeats, timed)
    return {
        "step_time": times,
        "materialized": materialized_bytes([runs[2], runs[3]], batches),
        "write_path": [row for row in write_path_bytes(runs) if row.level >= 2],
        "bytes_by_batch": bytes_by_batch(runs),
        "page_balance": page_balance(
            runs, kv_bytes_per_page(model, deploy.index_k_dtype, deploy.page_size)
        ),
    }


def _cp_off(inputs: BenchInputs) -> SectionGenerator:
    model, deploy, batches = inputs.model, inputs.deploy, inputs.batches
    min_tokens = inputs.cp_min_tokens
    if min_tokens is None:
        min_tokens = default_min_tokens(batches)
    byte_jobs = cp_off_bytes_jobs(model, deploy, batches, min_tokens, device=inputs.device)
    jobs = cp_off_time_jobs(model, deploy, inputs.repeats, LEVELS[-1], device=inputs.device)
    runs = yield [*byte_jobs, *jobs]
    off_bytes = cp_off_bytes_rows(runs[:2], batches, min_tokens)
    times = cp_off_times(jobs, runs[2:])
    return {"cp_off": CpOffFigure(min_tokens, deploy.cp_size, off_bytes, times, LEVELS[-1])}


def _peer_read(inputs: BenchInputs) -> SectionGenerator:
    jobs = materialize_jobs(inputs.model, inputs.deploy, inputs.repeats, inputs.device)
    runs = [job_runs[0] for job_runs in (yield jobs)]
    return {
        "peer_read": peer_read_figure(inputs.model, runs, inputs.deploy),
        "overlap": overlap_figure(runs, inputs.deploy.cp_size),
    }


def _balance(inputs: BenchInputs) -> Figures:
    figure = balance_figure(
        inputs.model, inputs.deploy, inputs.batches, inputs.device, lambda _: None
    )
    return {"balance": figure}


class _SglangPluginSection:
    """The ``sglang_plugin`` figure's process, started when the section's turn comes, read
    after the gloo group (it has no rank jobs of its own)."""

    def __init__(self, run: SglangPluginRun) -> None:
        self.run = run

    def jobs(self) -> list[RankJob]:
        return []

    def finish(self, runs: GroupRuns) -> Figures:
        return {"sglang_plugin": self.run.figure()}

    def close(self) -> None:
        self.run.close()


def _sglang_plugin(inputs: BenchInputs) -> GroupPart:
    return _SglangPluginSection(SglangPluginRun(inputs.deploy.cp_size))


def _pd(inputs: BenchInputs) -> GroupPart:
    return _PdSection(PdPart(inputs.model, inputs.deploy, inputs.batches, (0, 2, 5)))


SECTIONS: tuple[Section, ...] = (
    Section(
        "sglang_plugin",
        "SGLang's own tail all-gather, stock vs the plugin, 7,168 x bf16, bs 1-64",
        _sglang_plugin,
    ),
    Section("gate", "gate decision time per batch, bs 1/32/256", _gate),
    Section("host_plan", "host plan time, 8 requests x 4K/32K/128K history", _host_plan),
    Section("remaps", "slot vs unique remap", _remaps),
    Section("rollback", "rollback save copy vs batch time, levels 0/2/5", _rollback),
    Section("pd", "PD over Mooncake loopback: levels 0/2/5, decode cp 1/N/M", _pd),
    Section("tail_bytes", "phase-1 tail bytes", _tail_bytes),
    Section("kv_share", "per-rank KV bytes, cp 2/4/8", _kv_share),
    Section("balance", "split balance of the synth presets, round-robin write path", _balance),
    Section("step_time", "step time of levels 0-5 and their bytes, gloo ranks", _step_time),
    Section("cp_off", "CP off: bytes and step time by batch size, gloo ranks", _cp_off),
    Section("peer_read", "gather vs peer-read, prefetch off vs on, gloo ranks", _peer_read),
)
"""Every section, in the order their functions are called (module docstring): the SGLang
plugin's process (it runs beside all the rest), the timed in-process ones, then PD (its
decode processes start from here on), then those that count bytes and the gloo ones."""


def section_names() -> list[str]:
    """The names ``--only`` takes."""
    return [section.name for section in SECTIONS]
