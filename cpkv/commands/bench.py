"""``cpkv bench``: the performance figures, measured side by side in one run (the figures are
:mod:`cpkv.bench`'s; their tables :mod:`cpkv.render.bench`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from cpkv.bench.suite import run_bench
from cpkv.commands.options import DeviceOpt, JsonOpt, out_option, print_written
from cpkv.commands.shared import RUN_MODEL, dry_run_exit
from cpkv.common.console import bad_input_exits, emit, err, out
from cpkv.common.devices import Device, check_device
from cpkv.common.settings import RunSettings
from cpkv.render.bench import render_bench
from cpkv.run.builtin_trace import demo_trace
from cpkv.run.launchers import refuse_torchrun
from cpkv_core.config import DeploymentConfig, model_preset
from cpkv_core.traces import load_trace
from flags import debug_benchmark_warning, resolve_flags
from phases.registry import REGISTERED_PHASES

CpSizeOpt = Annotated[
    int, typer.Option("--cp-size", help="CP ranks for gate timing and the gloo step time.")
]
PageSizeOpt = Annotated[int, typer.Option("--page-size", help="Tokens per KV page.")]
RepeatsOpt = Annotated[
    int, typer.Option("--repeats", min=1, help="Timed rounds per figure, after a warm-up.")
]
TraceOpt = Annotated[
    Path | None,
    typer.Option("--trace", metavar="TRACE", help="Trace to measure; default: the built-in one."),
]
CpMinTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--nsa-prefill-cp-min-tokens",
        metavar="N",
        min=0,
        help="The cp_off figure's bytes: batches below N tokens, CP on vs off. Default: "
        "the trace's median batch size.",
    ),
]


def bench_command(
    cp_size: CpSizeOpt = 4,
    page_size: PageSizeOpt = 64,
    repeats: RepeatsOpt = 3,
    trace_path: TraceOpt = None,
    cp_min_tokens: CpMinTokensOpt = None,
    device: DeviceOpt = Device.CPU,
    as_json: JsonOpt = False,
    out_dir: Annotated[Path | None, out_option("bench.json and one PNG per figure")] = None,
) -> None:
    """Performance figures, measured side by side in one run: bytes counted exactly, times as
    medians after a warm-up, headline figures as ratios. With --device meta, a dry run of
    levels 0-5 on the trace instead."""
    with bad_input_exits():
        deploy = DeploymentConfig(cp_size=cp_size, page_size=page_size)
        flags = resolve_flags().flags  # the debug checks and their warning come from the env
        trace = demo_trace(page_size) if trace_path is None else load_trace(trace_path, page_size)
        check_device(device)
        refuse_torchrun("cpkv bench", flags.launcher)
    if device is Device.META:
        every_phase = RunSettings(deploy, frozenset(REGISTERED_PHASES), None, False)
        dry_run_exit(every_phase, trace.batches, as_json)
    warning = debug_benchmark_warning(flags)
    if warning:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    with err.status("bench") as status:
        report = run_bench(
            model_preset(RUN_MODEL),
            deploy,
            trace.batches,
            repeats,
            warnings=[warning] if warning else [],
            debug_checks=flags.debug_cp_shared_kv,
            on_step=lambda name: status.update(f"bench: {name}"),
            device=str(device),
            cp_min_tokens=cp_min_tokens,
        )
    emit(as_json, report.to_json(), lambda: render_bench(out, report))
    if out_dir is not None:
        from cpkv.plots import write_outputs  # NOTE: loads matplotlib only for --out
        from cpkv.plots.bench_plots import BENCH_FIGURES

        documents = {"bench": report.to_json()}
        print_written(write_outputs(out_dir, "bench", documents, BENCH_FIGURES))


def register(app: typer.Typer) -> None:
    """Adds ``bench`` to ``app``."""
    app.command("bench")(bench_command)
