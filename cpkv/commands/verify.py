"""``cpkv verify``: run a trace on CP ranks at every level and compare each batch with the
reference; the ranks are spawned here, or this process is one rank torchrun started and
the ranks may span machines."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NoReturn

import typer

from cpkv.commands.options import VERIFY_OPTIONS, JsonOpt, RunOptions, TraceArg, takes_run_options
from cpkv.commands.shared import dry_run_exit, run_verify, runnable_model
from cpkv.common.console import bad_input_exits, emit, out, warn
from cpkv.common.devices import Device, check_device
from cpkv.render.batches import render_verify
from cpkv.render.progress import with_progress
from cpkv.run.explain import sharded_trace_warnings
from cpkv.run.jobs import RankJob
from cpkv.run.launchers import dist_backend, torchrun_worker
from cpkv.run.runner import run_jobs_in_group
from cpkv.run.shadow import check_fault_batch
from cpkv.run.verify import VerifyReport, verify_job, verify_runs
from cpkv_core.dist import TorchrunEnv, TorchrunGroup
from cpkv_core.traces import load_trace


@takes_run_options(*VERIFY_OPTIONS)
def verify_command(trace_path: TraceArg, run: RunOptions, as_json: JsonOpt = False) -> None:
    """Run TRACE on CP ranks at every level 0..highest enabled phase and compare every batch
    with the non-CP reference. Exit 0 only when every batch of every level matches. With
    --device meta, a dry run instead: every level's whole step on shapes alone, naming the
    first op that needed a value or a tensor on another device."""
    with bad_input_exits():
        settings = run.settings()
        model = runnable_model(run.model_name)
        trace = load_trace(trace_path, settings.deploy.page_size)
        check_fault_batch(settings.fault, trace.batches)
        check_device(run.device)
        worker = torchrun_worker(
            settings.launcher, run.backend, settings.deploy.cp_size, run.device
        )
    warn(sharded_trace_warnings(trace.batches, settings.enabled, settings.deploy))
    job = verify_job(model, settings, trace.batches)
    render = partial(render_verify, out, deploy=settings.deploy)
    if worker is not None:
        verify_on_torchrun(worker, job, dist_backend(run.device), as_json, render)
    if run.device is Device.META:
        dry_run_exit(settings, trace.batches, as_json)
    report = run_verify(job, run.backend, not as_json)
    emit(as_json, report.to_json(), lambda: render(report))
    raise typer.Exit(0 if report.ok else 1)


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


def register(app: typer.Typer) -> None:
    """Adds ``verify`` to ``app``."""
    app.command("verify")(verify_command)
