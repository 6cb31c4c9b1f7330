"""The trace runner: drives a trace through CP ranks (real gloo processes or in-process threads)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch

from cpkv_core.config import DeploymentConfig, ModelConfig
from cpkv_core.dist.comm import Communicator, new_group_communicator
from cpkv_core.dist.launch import ProgressEvent, report_progress, spawn_group
from cpkv_core.dist.local_group import run_local
from cpkv_core.pd.prefill import PdTarget, SendResult, send_requests
from cpkv_core.planning.batch import BatchSpec
from cpkv_core.planning.execution import ExecutionPlan, KvLayout
from cpkv_core.runtime.engine import CPEngine
from cpkv_core.runtime.outputs import BatchOutput, RankBatchOutput, merge_rank_outputs
from cpkv_core.runtime.reference import ReferenceModel


class Backend(StrEnum):
    """Where CP ranks run."""

    GLOO = "gloo"
    """One process per rank, a real torch.distributed gloo group."""
    LOCAL = "local"
    """One thread per rank in this process, through the same communication interface."""


@dataclass(frozen=True, slots=True)
class RankJob:
    """Everything a rank needs to run a trace at several levels; picklable."""

    model: ModelConfig
    deploy: DeploymentConfig
    batches: tuple[BatchSpec, ...]
    plans_by_level: tuple[tuple[ExecutionPlan, ...], ...]
    """For each level run, one plan per batch."""
    num_pages: int
    debug_checks: bool = False
    """Run the sharded-KV invariant checks (they synchronise)."""
    pd: PdTarget | None = None
    """After each level's trace, send every request to this decode server (PD)."""


@dataclass(frozen=True, slots=True)
class RankRun:
    """One rank's part of one level: its batch outputs and, with PD, its send results."""

    outputs: list[RankBatchOutput]
    pd: list[SendResult]


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """Sent by rank 0 after each batch: level run index and batch index."""

    run: int
    batch: int


@dataclass(frozen=True, slots=True)
class LevelRun:
    """One level's run of a trace: merged outputs and per-rank pieces, batch by batch."""

    outputs: tuple[BatchOutput, ...]
    rank_outputs: tuple[tuple[RankBatchOutput, ...], ...]
    """``rank_outputs[batch][rank]``."""
    pd: tuple[tuple[SendResult, ...], ...] = ()
    """``pd[rank]``: how each request went from each rank (PD runs only)."""


def level_layout(plans: Sequence[ExecutionPlan]) -> KvLayout:
    """The KV layout every plan of a level stores into; one per level (KV at rest is fixed)."""
    layouts = {plan.kv_layout for plan in plans}
    if len(layouts) > 1:
        raise RuntimeError(f"a level mixes KV layouts {sorted(layouts)}, indicates a gate bug")
    return layouts.pop() if layouts else KvLayout.REPLICATED


def request_order(batches: Sequence[BatchSpec]) -> list[str]:
    """Every rid of a trace, in order of first appearance."""
    return list(dict.fromkeys(req.rid for batch in batches for req in batch.requests))


def _run_job(
    comm: Communicator, job: RankJob, notify: Callable[[BatchProgress], None] | None
) -> list[RankRun]:
    """One rank's part: a fresh engine per level, every batch in order, then PD if asked;
    rank 0 notifies progress."""
    results = []
    for run, plans in enumerate(job.plans_by_level):
        engine = CPEngine(
            job.model,
            job.deploy,
            comm,
            job.num_pages,
            kv_layout=level_layout(plans),
            debug_checks=job.debug_checks,
        )
        outputs = []
        for batch, plan in zip(job.batches, plans, strict=True):
            outputs.append(engine.run_batch(batch, plan))
            if comm.rank == 0 and notify is not None:
                notify(BatchProgress(run, batch.batch))
        sent: list[SendResult] = []
        if job.pd is not None:
            target = dataclasses.replace(job.pd, rid_prefix=f"{job.pd.rid_prefix}{run}/")
            sent = send_requests(engine, request_order(job.batches), target)
        results.append(RankRun(outputs, sent))
    return results


def run_jobs_rank(comm: Communicator, jobs: tuple[RankJob, ...]) -> list[list[RankRun] | None]:
    """Entry point of a spawned rank: runs every job on the first ``cp_size`` ranks of the
    group (a subgroup when smaller), streaming progress to the parent; None where this rank
    is not in a job's group."""
    results: list[list[RankRun] | None] = []
    for job in jobs:
        cp_size = job.deploy.cp_size
        if cp_size == comm.world_size:
            member: Communicator | None = comm
        else:
            member = new_group_communicator(range(cp_size))
        results.append(_run_job(member, job, report_progress) if member is not None else None)
    return results


def _level_runs(job: RankJob, per_rank: Sequence[list[RankRun]]) -> list[LevelRun]:
    runs = []
    for run in range(len(job.plans_by_level)):
        by_batch = tuple(
            tuple(per_rank[rank][run].outputs[i] for rank in range(job.deploy.cp_size))
            for i in range(len(job.batches))
        )
        outputs = tuple(
            merge_rank_outputs(batch, pieces)
            for batch, pieces in zip(job.batches, by_batch, strict=True)
        )
        pd = tuple(tuple(per_rank[rank][run].pd) for rank in range(job.deploy.cp_size))
        runs.append(LevelRun(outputs, by_batch, pd))
    return runs


def run_jobs_on_gloo(
    jobs: Sequence[RankJob],
    on_progress: Callable[[BatchProgress], None] | None = None,
    timeout_s: float = 600.0,
) -> list[list[LevelRun]]:
    """Runs every job in ONE spawned gloo group sized for the largest job; smaller jobs run
    on subgroups. Returns each job's level runs."""

    def forward(event: object) -> None:
        if on_progress is not None and isinstance(event, ProgressEvent):
            assert isinstance(event.message, BatchProgress), event
            on_progress(event.message)

    world_size = max(job.deploy.cp_size for job in jobs)
    per_rank = spawn_group(
        world_size, run_jobs_rank, (tuple(jobs),), timeout_s=timeout_s, on_progress=forward
    )
    runs = []
    for index, job in enumerate(jobs):
        pieces = [per_rank[rank][index] for rank in range(job.deploy.cp_size)]
        runs.append(_level_runs(job, [p for p in pieces if p is not None]))
    return runs


def run_levels(
    job: RankJob,
    backend: Backend,
    on_progress: Callable[[BatchProgress], None] | None = None,
    timeout_s: float = 600.0,
) -> list[LevelRun]:
    """Runs ``job`` on ``job.deploy.cp_size`` ranks: one ``LevelRun`` per plans_by_level entry."""
    if backend is Backend.GLOO:
        return run_jobs_on_gloo([job], on_progress, timeout_s)[0]
    cp_size = job.deploy.cp_size
    per_rank = run_local(cp_size, lambda comm: _run_job(comm, job, on_progress), timeout_s)
    return _level_runs(job, per_rank)


def run_reference(job: RankJob) -> list[BatchOutput]:
    """The oracle's outputs for every batch of ``job``."""
    reference = ReferenceModel(
        job.model, job.num_pages, job.deploy.page_size, job.deploy.index_k_dtype
    )
    with torch.no_grad():
        return [reference.run_batch(batch) for batch in job.batches]
