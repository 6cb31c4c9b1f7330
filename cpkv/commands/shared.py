"""What several commands do alike: a verify run behind a progress bar, a PD run behind a
status line, and a dry run that prints and exits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

import typer

from cpkv.common.console import BadInput, emit, err, out
from cpkv.common.settings import RunSettings
from cpkv.render.progress import with_progress
from cpkv.render.reports import render_dry_run
from cpkv.run.dry_run import dry_run_levels
from cpkv.run.jobs import Backend, BatchProgress, RankJob
from cpkv.run.pd import PdHosts, pd_job, run_pd
from cpkv.run.pd_check import PdReport
from cpkv.run.runner import run_levels
from cpkv.run.verify import VerifyReport, verify_runs
from cpkv_core.config import ModelConfig, model_preset
from cpkv_core.dist import forked_ranks
from cpkv_core.planning import BatchSpec

RUN_MODEL = "tiny"
"""The one preset runs take (the others are for ``cpkv plan``)."""
RANK_MODULES = ("__main__", "cpkv.run.runner", "cpkv_core.pd.decode_rank")
"""What the rank server of a command imports once (``dist.forked_ranks``): the program (each
rank would run it again), the rank bodies of the gloo groups and of the decode processes."""


def runnable_model(name: str) -> ModelConfig:
    """The preset ``name``, when runs can take it.

    Raises:
        ValueError: an unknown preset.
        BadInput: a preset for planning only.
    """
    model = model_preset(name)
    if name != RUN_MODEL:
        raise BadInput(f"--model {name} is for planning only; runs need --model tiny on CPU")
    return model


def run_verify(job: RankJob, backend: Backend, show_progress: bool) -> VerifyReport:
    """Runs ``job`` on ranks this process starts and compares it with the reference, with a
    progress bar on stderr if ``show_progress``."""

    def run(on_progress: Callable[[BatchProgress], None] | None) -> VerifyReport:
        return verify_runs(job, run_levels(job, backend, on_progress))

    levels = job.levels
    description = f"levels {', '.join(map(str, levels))} on {job.deploy.cp_size} {backend} ranks"
    # NOTE: the ranks fork from one server that imported torch once (seconds a process).
    with forked_ranks(RANK_MODULES):
        return with_progress(show_progress, description, len(job.batches) * len(levels), run)


def run_pd_job(
    settings: RunSettings, batches: tuple[BatchSpec, ...], timeout_s: float, retries: int
) -> PdReport:
    """Prefills ``batches`` at the highest enabled level and sends every request to a decode
    process (``run.pd.run_pd``), with a status line on stderr."""
    deploy = settings.deploy
    ranks = f"{deploy.cp_size} gloo ranks"
    with err.status(f"prefill on {ranks}, transfer to {deploy.decode_cp_size} decode rank(s)"):
        hosts = PdHosts(settings.pd_host, settings.pd_local_host)
        job = pd_job(settings, batches)
        with forked_ranks(RANK_MODULES):
            (report,), _ = run_pd(model_preset(RUN_MODEL), [job], timeout_s, retries, hosts=hosts)
    return report


def dry_run_exit(settings: RunSettings, batches: Sequence[BatchSpec], as_json: bool) -> NoReturn:
    """Runs every level of ``settings`` on ``meta``, prints the report and exits 0 when every
    level ran (1 otherwise)."""
    report = dry_run_levels(model_preset(RUN_MODEL), settings, batches)
    emit(as_json, report.to_json(), lambda: render_dry_run(out, report))
    raise typer.Exit(0 if report.ok else 1)
