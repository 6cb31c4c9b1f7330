"""``cpkv pd``: prefill a trace on CP ranks and send every request to a decode group over
Mooncake (``--decode-cp-size`` ranks, 1: a non-CP decode process); check the rebuilt KV and
a decode step against the reference."""

from __future__ import annotations

from typing import Annotated

import typer

from cpkv.commands.options import PD_OPTIONS, JsonOpt, RunOptions, TraceArg, takes_run_options
from cpkv.commands.shared import dry_run_exit, run_pd_job
from cpkv.common.console import BadInput, bad_input_exits, emit, out
from cpkv.common.devices import Device, check_device
from cpkv.render.batches import print_failures
from cpkv.render.reports import render_pd
from cpkv.run.launchers import refuse_torchrun
from cpkv.run.shadow import check_fault_batch
from cpkv_core.traces import load_trace

TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0.1,
        help="Seconds the decode side waits for every rank of one attempt (>= 0.1).",
    ),
]
RetriesOpt = Annotated[
    int, typer.Option("--retries", min=0, help="New attempts after a failed one, per request.")
]


@takes_run_options(*PD_OPTIONS)
def pd_command(
    trace_path: TraceArg,
    run: RunOptions,
    timeout: TimeoutOpt = 30.0,
    retries: RetriesOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Prefill TRACE on CP ranks at the highest enabled level and send every request to
    --decode-cp-size decode processes over Mooncake (TCP, at --pd-host). Checks the rebuilt
    KV byte for byte and one decode step against the reference; exit 0 only when every
    request checks out. --device meta: a dry run of the prefill."""
    with bad_input_exits():
        settings = run.settings()
        trace = load_trace(trace_path, settings.deploy.page_size)
        check_fault_batch(settings.fault, trace.batches)
        check_device(run.device)
        refuse_torchrun("cpkv pd", settings.launcher)
        if run.device is Device.CUDA:
            raise BadInput(
                "cpkv pd --device cuda needs Mooncake's CUDA build to register GPU pools; the "
                "pd extra installs the CPU build (mooncake-transfer-engine-non-cuda)"
            )
    if run.device is Device.META:
        dry_run_exit(settings, trace.batches, as_json)
    report = run_pd_job(settings, trace.batches, timeout, retries)

    def render() -> None:
        render_pd(out, report)
        if report.shadow is not None:
            out.print(report.shadow.text(), highlight=False, markup=False)
        print_failures(out, report.failures, "prefill failures")

    emit(as_json, report.to_json(), render)
    raise typer.Exit(0 if report.ok else 1)


def register(app: typer.Typer) -> None:
    """Adds ``pd`` to ``app``."""
    app.command("pd")(pd_command)
