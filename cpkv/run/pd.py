"""``cpkv pd``: prefill on CP ranks, transfer every request to a non-CP decode process over
Mooncake, and check the rebuilt KV and a decode step against the reference."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cpkv.common.settings import RunSettings
from cpkv.run.decode_process import DecodeServerError, start_decode
from cpkv.run.failure_summary import summarize_failures
from cpkv.run.jobs import BatchProgress, LevelRun, job_for
from cpkv.run.pd_check import PdReport, pd_results, reference_requests
from cpkv.run.runner import run_jobs_on_gloo
from cpkv.run.shadow import ShadowEntry, shadow_fault, summarize
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.pd import (
    LOOPBACK,
    MIN_WRITE_BYTES,
    STAGING_BYTES,
    PdFaults,
    PdTarget,
    ReportReply,
)
from cpkv_core.planning import (
    BatchSpec,
)
from cpkv_core.runtime import SHADOW_TAG, Fault
from phases import PhaseId


@dataclass(frozen=True, slots=True)
class PdHosts:
    """Where the PD processes are reached: host names or addresses, never wildcards."""

    decode: str = LOOPBACK
    """The decode server's control listener and transfer engine (``--pd-host``)."""
    prefill: str = LOOPBACK
    """The prefill ranks' transfer engines (``--pd-local-host``)."""


@dataclass(frozen=True, slots=True)
class PdJob:
    """One deployment's trace at some levels, for a PD run."""

    deploy: DeploymentConfig
    batches: tuple[BatchSpec, ...]
    levels: tuple[int, ...]
    enabled: frozenset[PhaseId] = frozenset(PhaseId)
    ceiling: int | None = None
    debug_checks: bool = False
    """Run the sharded-KV invariant checks on the prefill ranks (they synchronise)."""
    shadow_rate: float = 0.0
    """Share of prefill batches shadow-verified."""
    fault: Fault | None = None
    """A game-day fault injected into the prefill's candidate path."""
    staging_bytes: int = STAGING_BYTES
    """Bytes of one PD write call at most (each prefill rank's staging buffer)."""
    min_write_bytes: int = MIN_WRITE_BYTES
    """Queued bytes that make a prefill rank write before a request's final chunk."""
    probe: bool = False
    """After each level, the ranks time the bench's baselines: one large write of the level's
    KV bytes (rank 0) and every rank writing its share at once (``probe.time_baselines``)."""
    overlap: bool = True
    """Prefill ranks write on a writer thread while they compute; False: synchronously."""
    batch_timeout_s: float = 60.0
    """Seconds a prefill batch's collective waits for a stalled rank."""


def pd_job(settings: RunSettings, batches: tuple[BatchSpec, ...]) -> PdJob:
    """The highest enabled level of ``settings`` (``RunSettings.top_level``) as a PD job."""
    return PdJob(
        settings.deploy,
        batches,
        (settings.top_level(),),
        settings.enabled,
        settings.ceiling,
        settings.debug_checks,
        settings.shadow_rate,
        settings.fault,
        batch_timeout_s=settings.batch_timeout_s,
    )


def decode_pages_for(batches: Sequence[BatchSpec], page_size: int) -> int:
    """Decode-side pages for every request of a trace (no prefix sharing there) plus the
    decode step's token."""
    seq_lens: dict[str, int] = {}
    for batch in batches:
        for req in batch.requests:
            seq_lens[req.rid] = req.seq_len
    return sum(-(-(n + 1) // page_size) for n in seq_lens.values())


def run_entries(level: int, run: LevelRun) -> list[ShadowEntry]:
    """The shadow entries of one level's prefill run (rank 0's outcome: every rank agrees)."""
    return [
        ShadowEntry(
            level,
            step.scheduled.batch,
            pieces[0].shadow,
            pieces[0].gathered_bytes.get(SHADOW_TAG, 0),
        )
        for step, pieces in zip(run.steps, run.rank_outputs, strict=True)
    ]


def run_pd(
    model: ModelConfig,
    jobs: Sequence[PdJob],
    timeout_s: float = 30.0,
    retries: int = 0,
    faults: PdFaults | None = None,
    die_on_done_of: str | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    hosts: PdHosts | None = None,
) -> tuple[list[PdReport], list[list[LevelRun]]]:
    """Prefill every job on ONE gloo group (subgroups for smaller CP sizes), send every
    request of every level to ONE decode process, check each against the reference.

    Jobs must share page size and index K dtype (the decode pool has one layout). ``hosts``
    names the decode server's and the prefill ranks' addresses (loopback by default).
    """
    hosts = hosts or PdHosts()
    first = jobs[0].deploy
    decode_pages = sum(
        len(job.levels) * decode_pages_for(job.batches, first.page_size) for job in jobs
    )
    decode = start_decode(model, first, decode_pages, timeout_s, die_on_done_of, hosts.decode)
    try:
        rank_jobs = [
            job_for(
                model,
                job.deploy,
                job.batches,
                job.levels,
                job,
                pd=PdTarget(
                    decode.address,
                    decode.authkey,
                    f"j{index}/",
                    retries,
                    faults or PdFaults(),
                    job.staging_bytes,
                    job.min_write_bytes,
                    job.probe,
                    hosts.prefill,
                    job.overlap,
                ),
            )
            for index, job in enumerate(jobs)
        ]
        runs = run_jobs_on_gloo(rank_jobs, on_progress)
        try:
            decode_report: ReportReply | None = decode.report()
            errors: tuple[str, ...] = ()
        except DecodeServerError as exc:
            decode_report, errors = None, (str(exc),)
    finally:
        decode.stop()
    reports = []
    for index, (job, job_runs) in enumerate(zip(jobs, runs, strict=True)):
        reference = reference_requests(model, job.deploy, job.batches)
        results = pd_results(job.levels, job_runs, reference, decode_report, f"j{index}/")
        shadow = None
        fault = shadow_fault(job.fault)
        if job.shadow_rate > 0 or fault is not None:
            entries = [
                e for lv, r in zip(job.levels, job_runs, strict=True) for e in run_entries(lv, r)
            ]
            wrong = sum(not r.ok for r in results)
            shadow = summarize(job.shadow_rate, fault, entries, wrong)
        failures = summarize_failures(job.fault, job.levels, job_runs, len(job.batches))
        reports.append(PdReport(job.deploy.cp_size, tuple(results), errors, shadow, failures))
    return reports, runs
