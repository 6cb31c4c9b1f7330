"""The trace runner: drives a trace through CP ranks (real gloo processes or in-process threads).

Rank 0 runs the host loop (``loop.HostLoop``: schedule, gate) batch by batch and broadcasts
each step; every rank then plans and runs it, and runs it again on a lower phase when it
failed on every rank's agreement (``attempts``). Nothing is planned ahead for the trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from cpkv.run.attempts import LevelAttempts, RankFault, RunStopped
from cpkv.run.jobs import Backend, BatchProgress, LevelRun, RankJob, RankRun
from cpkv_core.config import ModelConfig
from cpkv_core.dist import (
    Communicator,
    ProgressEvent,
    TorchrunGroup,
    new_group_communicator,
    report_progress,
    run_local,
    spawn_group,
)
from cpkv_core.pd import (
    ConcurrentWrite,
    LargeWrite,
    SendResult,
    WriteStats,
    time_baselines,
)
from cpkv_core.planning import ScheduledBatch
from cpkv_core.runtime import (
    BatchOutput,
    RankBatchOutput,
    ReferenceModel,
    merge_rank_outputs,
)

__all__ = [
    "RankFault",
    "RunStopped",
    "run_jobs_in_group",
    "run_jobs_on_gloo",
    "run_jobs_rank",
    "run_levels",
    "run_reference",
]


def _to_host(out: RankBatchOutput) -> RankBatchOutput:
    return dataclasses.replace(
        out,
        local_token_indices=out.local_token_indices.cpu(),
        topk=out.topk.cpu(),
        last_hidden=out.last_hidden.cpu(),
        logits=out.logits.cpu(),
    )


def _run_level(
    comm: Communicator,
    job: RankJob,
    run: int,
    notify: Callable[[BatchProgress], None] | None,
) -> RankRun:
    level = LevelAttempts(comm, job, run)
    outputs, steps = [], []
    for batch in job.batches:
        out, step = level.run_batch(batch)
        if level.sender is not None:
            level.sender.after_batch(step.scheduled)  # PD streams as the KV fills
        outputs.append(_to_host(out))
        if level.loop is not None:
            # NOTE: every rank reached the same verdict; rank 0's gate acts on it before
            # the next batch is decided.
            level.loop.report(batch.batch, out.shadow)
            steps.append(step)
            if notify is not None:
                notify(BatchProgress(run, batch.batch))
    sender, loop = level.sender, level.loop
    sent: list[SendResult] = []
    probe: LargeWrite | None = None
    concurrent: ConcurrentWrite | None = None
    stats: WriteStats | None = None
    if sender is not None:
        sent, stats = sender.finish(), sender.stats
        if sender.target.probe:
            probe, concurrent = time_baselines(
                sender.target, sender.total_bytes, comm.rank, comm.world_size, comm.barrier
            )
        if loop is not None:
            for result in sent:
                if result.released:
                    loop.scheduler.release(result.rid)
    if level.engine is not None:
        level.engine.close()
    kills, failed = tuple(level.kills), tuple(level.failed)
    return RankRun(outputs, steps, sent, stats, probe, concurrent, kills, failed)


def _run_job(
    comm: Communicator, job: RankJob, notify: Callable[[BatchProgress], None] | None
) -> list[RankRun]:
    """One rank's part: a fresh engine and loop per level, every batch in order, then PD if
    asked; rank 0 notifies progress."""
    return [_run_level(comm, job, run, notify) for run in range(len(job.levels))]


def run_jobs_rank(comm: Communicator, jobs: tuple[RankJob, ...]) -> list[list[RankRun] | None]:
    """Entry point of a spawned rank: runs every job on a subgroup of the first ``cp_size``
    ranks with the job's batch timeout, streaming progress to the parent; None where this
    rank is not in a job's group."""
    results: list[list[RankRun] | None] = []
    for index, job in enumerate(jobs):
        # NOTE: the job's own group carries the batch timeout (the default group's is the
        # whole run's, which the rendezvous of freshly started processes needs).
        member = new_group_communicator(range(job.deploy.cp_size), job.batch_timeout_s)

        def notify(progress: BatchProgress, index: int = index) -> None:
            report_progress(dataclasses.replace(progress, job=index))

        results.append(_run_job(member, job, notify) if member is not None else None)
    return results


def _level_runs(job: RankJob, per_rank: Sequence[list[RankRun]]) -> list[LevelRun]:
    runs = []
    for run, level in enumerate(job.levels):
        by_batch = tuple(
            tuple(per_rank[rank][run].outputs[i] for rank in range(job.deploy.cp_size))
            for i in range(len(job.batches))
        )
        outputs = tuple(
            merge_rank_outputs(batch, pieces)
            for batch, pieces in zip(job.batches, by_batch, strict=True)
        )
        pd = tuple(tuple(per_rank[rank][run].pd) for rank in range(job.deploy.cp_size))
        steps = tuple(per_rank[0][run].steps)
        stats = tuple(
            s for rank in range(job.deploy.cp_size) if (s := per_rank[rank][run].pd_stats)
        )
        probe = per_rank[0][run].pd_probe
        concurrent = tuple(
            c for rank in range(job.deploy.cp_size) if (c := per_rank[rank][run].pd_concurrent)
        )
        first = per_rank[0][run]
        runs.append(
            LevelRun(
                level,
                steps,
                outputs,
                by_batch,
                pd,
                stats,
                probe,
                concurrent,
                first.kills,
                first.failed,
            )
        )
    return runs


def _where(jobs: Sequence[RankJob], last: list[BatchProgress]) -> str:
    """The batch a stopped group was in, from the last batch rank 0 finished (single job)."""
    if not last:
        return "before any batch had finished"
    run, done = last[0].run, last[0].batch
    numbers = [b.batch for b in jobs[0].batches]
    if len(jobs) == 1 and done in numbers[:-1]:
        failed = numbers[numbers.index(done) + 1]
        return f"in run {run} batch {failed}, after batch {done} had finished"
    return f"after run {run} batch {done} had finished"


def _forward_progress(
    on_progress: Callable[[BatchProgress], None] | None, last: list[BatchProgress]
) -> Callable[[object], None]:
    """A launcher's ``on_progress``: keeps the last batch rank 0 finished, forwards it."""

    def forward(event: object) -> None:
        if isinstance(event, ProgressEvent):
            assert isinstance(event.message, BatchProgress), event
            last[:] = [event.message]
            if on_progress is not None:
                on_progress(event.message)

    return forward


def _job_runs(
    jobs: Sequence[RankJob], per_rank: Sequence[list[list[RankRun] | None]]
) -> list[list[LevelRun]]:
    """Each job's level runs from every rank's results (``per_rank[rank][job]``)."""
    runs = []
    for index, job in enumerate(jobs):
        pieces = [per_rank[rank][index] for rank in range(job.deploy.cp_size)]
        runs.append(_level_runs(job, [p for p in pieces if p is not None]))
    return runs


def run_jobs_on_gloo(
    jobs: Sequence[RankJob],
    on_progress: Callable[[BatchProgress], None] | None = None,
    timeout_s: float = 600.0,
) -> list[list[LevelRun]]:
    """Runs every job in ONE spawned gloo group sized for the largest job; smaller jobs run
    on subgroups. Returns each job's level runs."""
    last: list[BatchProgress] = []
    forward = _forward_progress(on_progress, last)
    world_size = max(job.deploy.cp_size for job in jobs)
    try:
        per_rank = spawn_group(
            world_size,
            run_jobs_rank,
            (tuple(jobs),),
            timeout_s=timeout_s,
            on_progress=forward,
            progress_type=BatchProgress,
        )
    except RuntimeError as exc:
        # NOTE: a rank that died or stalled reports nothing; the batch after the last one
        # rank 0 finished is the one it was in.
        raise RuntimeError(f"{exc}\n(the group stopped {_where(jobs, last)})") from exc
    return _job_runs(jobs, per_rank)


def run_jobs_in_group(
    group: TorchrunGroup,
    jobs: Sequence[RankJob],
    on_progress: Callable[[BatchProgress], None] | None = None,
) -> list[list[LevelRun]] | None:
    """Runs every job with this process as one rank of a torchrun ``group`` (the same rank
    body as ``run_jobs_on_gloo``): each job's level runs on rank 0, None on the others.

    Raises:
        ValueError: the group's world size is not the largest job's CP size.
    """
    world_size = max(job.deploy.cp_size for job in jobs)
    if group.world_size != world_size:
        raise ValueError(
            f"torchrun started {group.world_size} ranks (WORLD_SIZE) but the run needs "
            f"--cp-size {world_size}: make --nnodes x --nproc-per-node equal the CP size"
        )
    per_rank = group.run(
        run_jobs_rank, (tuple(jobs),), on_progress=_forward_progress(on_progress, [])
    )
    return None if per_rank is None else _job_runs(jobs, per_rank)


def run_levels(
    job: RankJob,
    backend: Backend,
    on_progress: Callable[[BatchProgress], None] | None = None,
    timeout_s: float = 600.0,
) -> list[LevelRun]:
    """Runs ``job`` on ``job.deploy.cp_size`` ranks: one ``LevelRun`` per entry of
    ``job.levels``."""
    if backend is Backend.GLOO:
        return run_jobs_on_gloo([job], on_progress, timeout_s)[0]
    cp_size = job.deploy.cp_size
    per_rank = run_local(
        cp_size, lambda comm: _run_job(comm, job, on_progress), min(timeout_s, job.batch_timeout_s)
    )
    return _level_runs(job, per_rank)


def run_reference(
    model: ModelConfig, job: RankJob, batches: Sequence[ScheduledBatch]
) -> list[BatchOutput]:
    """The oracle's outputs for every scheduled batch of a run (on the job's device)."""
    reference = ReferenceModel(
        model, job.num_pages, job.deploy.page_size, job.deploy.index_k_dtype, device=job.device
    )
    with torch.no_grad():
        return [_output_to_host(reference.run_batch(batch)) for batch in batches]


def _output_to_host(output: BatchOutput) -> BatchOutput:
    return dataclasses.replace(
        output,
        requests=tuple(
            dataclasses.replace(
                r, last_hidden=r.last_hidden.cpu(), logits=r.logits.cpu(), topk=r.topk.cpu()
            )
            for r in output.requests
        ),
    )
