"""``cpkv pd``: prefill on CP ranks, transfer every request to a decode group over Mooncake
(``decode_cp_size`` ranks, each receiving the pages it owns straight from their prefill
owners; 1: a non-CP decode process), and check the rebuilt KV and a decode step against the
reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

from cpkv.common.settings import RunSettings
from cpkv.run.decode_process import DecodeGroup, DecodeServerError, start_decode_group
from cpkv.run.failure_summary import summarize_failures
from cpkv.run.jobs import BatchProgress, LevelRun, RankJob, final_seq_lens, job_for
from cpkv.run.pd_check import PdReport, ReferenceRequest, pd_results, reference_requests
from cpkv.run.runner import run_jobs_on_gloo
from cpkv.run.shadow import ShadowEntry, shadow_fault, summarize
from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.pd import (
    ANY_PREFILL,
    LOOPBACK,
    MIN_WRITE_BYTES,
    STAGING_BYTES,
    DecodeSpec,
    PdFaults,
    PdTarget,
    ReportReply,
)
from cpkv_core.planning import BatchSpec
from cpkv_core.planning.pd_reshard import decode_pages_per_rank
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


@dataclass(frozen=True, slots=True)
class DecodeAs:
    """A decode group configured apart from the prefill it serves (a drill of a mismatched
    deployment, which the handshake refuses); None keeps the prefill's value."""

    model: ModelConfig | None = None
    page_size: int | None = None


def decode_specs(
    model: ModelConfig, jobs: Sequence[PdJob], timeout_s: float, decode_as: DecodeAs
) -> dict[int, DecodeSpec]:
    """One decode group per decode CP size of ``jobs``, its pools sized for every request
    of every level of the jobs it serves (no prefix sharing there, one decode token each).

    Jobs of one decode CP size share page size and index K dtype (one pool layout).
    """
    specs = {}
    for size in dict.fromkeys(job.deploy.decode_cp_size for job in jobs):
        served = [job for job in jobs if job.deploy.decode_cp_size == size]
        first = served[0].deploy
        pages = sum(
            len(job.levels)
            * decode_pages_per_rank(
                list(final_seq_lens(job.batches).values()), first.page_size, size
            )
            for job in served
        )
        prefill = {job.deploy.cp_size for job in served}
        spec = DecodeSpec(
            model,
            first.page_size,
            first.index_k_dtype,
            pages,
            timeout_s,
            size,
            prefill.pop() if len(prefill) == 1 else ANY_PREFILL,
        )
        specs[size] = replace(
            spec,
            model=decode_as.model or spec.model,
            page_size=decode_as.page_size or spec.page_size,
        )
    return specs


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


def _start_groups(
    specs: dict[int, DecodeSpec], die_on_done_of: str | None, host: str
) -> dict[int, DecodeGroup]:
    """Every decode group, started at once (a process start costs seconds)."""
    with ThreadPoolExecutor(len(specs)) as pool:
        started = {
            size: pool.submit(start_decode_group, spec, die_on_done_of, host)
            for size, spec in specs.items()
        }
        return {size: future.result() for size, future in started.items()}


def _report(group: DecodeGroup) -> tuple[list[ReportReply] | None, tuple[str, ...]]:
    """A decode group's reports, or why it could not report."""
    try:
        return group.report(), ()
    except DecodeServerError as exc:
        return None, (str(exc),)


def _stop_groups(groups: list[DecodeGroup]) -> None:
    """Stops every decode group at once (each waits for its processes to exit)."""
    if groups:
        with ThreadPoolExecutor(len(groups)) as pool:
            list(pool.map(DecodeGroup.stop, groups))


@dataclass
class PdSession:
    """The decode groups of a PD run, started, and the prefill jobs that send to them: run
    ``rank_jobs`` on a gloo group (alone, or beside other jobs), then ask for ``reports``."""

    model: ModelConfig
    jobs: Sequence[PdJob]
    groups: dict[int, DecodeGroup]
    """One decode group per decode CP size of ``jobs``."""
    rank_jobs: list[RankJob]
    """``jobs`` as prefill rank jobs, each with its target (in ``jobs``' order)."""

    def decode_reports(self) -> dict[int, tuple[list[ReportReply] | None, tuple[str, ...]]]:
        """Every decode group's reports (their decode steps), or why it could not report."""
        with ThreadPoolExecutor(len(self.groups)) as pool:
            return dict(zip(self.groups, pool.map(_report, self.groups.values()), strict=True))

    def reports(
        self,
        runs: Sequence[list[LevelRun]],
        decoded: dict[int, tuple[list[ReportReply] | None, tuple[str, ...]]],
    ) -> list[PdReport]:
        """Each job's report: its runs and its decode group's reports against the
        reference."""
        references: dict[object, dict[str, ReferenceRequest]] = {}
        return [
            _job_report(self.model, index, job, job_runs, decoded, references)
            for index, (job, job_runs) in enumerate(zip(self.jobs, runs, strict=True))
        ]


@contextmanager
def pd_session(
    model: ModelConfig,
    jobs: Sequence[PdJob],
    timeout_s: float = 30.0,
    retries: int = 0,
    faults: PdFaults | None = None,
    die_on_done_of: str | None = None,
    hosts: PdHosts | None = None,
    decode_as: DecodeAs | None = None,
) -> Iterator[PdSession]:
    """Starts the decode groups of ``jobs`` (one per decode CP size, each
    ``decode_cp_size`` processes) and stops them on leaving; see ``run_pd``."""
    hosts = hosts or PdHosts()
    specs = decode_specs(model, jobs, timeout_s, decode_as or DecodeAs())
    groups: dict[int, DecodeGroup] = {}
    try:
        groups = _start_groups(specs, die_on_done_of, hosts.decode)
        rank_jobs = []
        for index, job in enumerate(jobs):
            group = groups[job.deploy.decode_cp_size]
            target = PdTarget(
                group.addresses,
                group.authkey,
                f"j{index}/",
                retries,
                faults or PdFaults(),
                job.staging_bytes,
                job.min_write_bytes,
                job.probe,
                hosts.prefill,
                job.overlap,
            )
            rank_jobs.append(job_for(model, job.deploy, job.batches, job.levels, job, pd=target))
        yield PdSession(model, jobs, groups, rank_jobs)
    finally:
        _stop_groups(list(groups.values()))


def run_pd(
    model: ModelConfig,
    jobs: Sequence[PdJob],
    timeout_s: float = 30.0,
    retries: int = 0,
    faults: PdFaults | None = None,
    die_on_done_of: str | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    hosts: PdHosts | None = None,
    decode_as: DecodeAs | None = None,
) -> tuple[list[PdReport], list[list[LevelRun]]]:
    """Prefill every job on ONE gloo group (subgroups for smaller CP sizes), send every
    request of every level to the decode group of the job's decode CP size (one group per
    size, each ``decode_cp_size`` processes), check each against the reference.

    ``hosts`` names the decode ranks' and the prefill ranks' addresses (loopback by
    default); ``decode_as`` configures the decode groups unlike the prefill (a drill).
    """
    with pd_session(
        model, jobs, timeout_s, retries, faults, die_on_done_of, hosts, decode_as
    ) as session:
        runs = run_jobs_on_gloo(session.rank_jobs, on_progress)
        decoded = session.decode_reports()
    return session.reports(runs, decoded), runs


def _job_report(
    model: ModelConfig,
    index: int,
    job: PdJob,
    job_runs: list[LevelRun],
    decoded: dict[int, tuple[list[ReportReply] | None, tuple[str, ...]]],
    references: dict[object, dict[str, ReferenceRequest]],
) -> PdReport:
    """One job's report; ``references`` caches the reference runs by trace and layout."""
    decode_reports, errors = decoded[job.deploy.decode_cp_size]
    # NOTE: the oracle depends on the trace and the page layout alone, not on the CP
    # sizes: jobs that share them share one reference run (seconds at wide rows).
    key = (job.batches, job.deploy.page_size, job.deploy.index_k_dtype)
    if key not in references:
        references[key] = reference_requests(model, job.deploy, job.batches)
    results = pd_results(
        job.levels, job_runs, references[key], decode_reports, f"j{index}/", job.deploy.page_size
    )
    shadow = None
    fault = shadow_fault(job.fault)
    if job.shadow_rate > 0 or fault is not None:
        entries = [
            e for lv, r in zip(job.levels, job_runs, strict=True) for e in run_entries(lv, r)
        ]
        wrong = sum(not r.ok for r in results)
        shadow = summarize(job.shadow_rate, fault, entries, wrong)
    failures = summarize_failures(job.fault, job.levels, job_runs, len(job.batches))
    refusals = tuple(e for reply in decode_reports or () for e in reply.errors)
    deploy = job.deploy
    return PdReport(
        deploy.cp_size,
        tuple(results),
        errors + refusals,
        shadow,
        failures,
        deploy.decode_cp_size,
    )
