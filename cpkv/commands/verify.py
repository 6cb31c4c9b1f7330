"""``cpkv verify`` as one rank that torchrun started: the ranks may span machines."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import typer

from cpkv.common.console import emit
from cpkv.render.progress import with_progress
from cpkv.run.runner import RankJob, run_jobs_in_group
from cpkv.run.verify import VerifyReport, verify_runs
from cpkv_core.dist import TorchrunEnv, TorchrunGroup


def verify_on_torchrun(
    worker: TorchrunEnv,
    job: RankJob,
    backend: str,
    as_json: bool,
    render: Callable[[VerifyReport], None],
) -> NoReturn:
    """Runs this rank's part of ``job`` in the torchrun group, then on rank 0 compares with
    the reference and prints the report (``render`` for people); every rank exits with rank
    0's code, the others printing nothing.

    Args:
        worker: This process's torchrun place; ``worker.world_size`` is the CP size.
        job: What every rank runs (``verify_job``).
        backend: ``"gloo"`` or ``"nccl"`` (``launchers.dist_backend``).
        as_json: Print the JSON document instead of calling ``render``.
        render: Prints the report for people.
    """
    with TorchrunGroup(worker, backend) as group:
        levels = ", ".join(map(str, job.levels))
        description = f"levels {levels} on {group.world_size} torchrun ranks"
        total = len(job.batches) * len(job.levels)
        runs = with_progress(
            not as_json and group.rank == 0,
            description,
            total,
            lambda on_progress: run_jobs_in_group(group, [job], on_progress),
        )
        code = 1
        try:
            if runs is not None:
                report = verify_runs(job, runs[0])
                emit(as_json, report.to_json(), lambda: render(report))
                code = 0 if report.ok else 1
        finally:
            # NOTE: also after a failure on rank 0, so that the others stop waiting.
            code = group.share_exit_code(code if runs is not None else None)
    raise typer.Exit(code)
