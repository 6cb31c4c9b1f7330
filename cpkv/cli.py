"""The ``cpkv`` command line (typer + rich). Exit codes: 0 ok, 1 failed check, 2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cpkv import docgen, flag_commands, plan_command
from cpkv.batch_tables import (
    render_demo,
    render_explain,
    render_explain_batch,
    render_verify_table,
)
from cpkv.bench import run_bench
from cpkv.builtin_trace import demo_trace
from cpkv.console import BadInput, ConfigOpt, JsonOpt, bad_input_exits, emit, err, out
from cpkv.explain import explain_trace
from cpkv.help_text import tidy_help
from cpkv.out_dir import out_option, print_written
from cpkv.pd import PdJob, PdReport, run_pd
from cpkv.phase_table import phase_rows
from cpkv.report import render_bench, render_pd, render_phases
from cpkv.runner import Backend, BatchProgress
from cpkv.settings import RunSettings, resolve_run
from cpkv.verify import VerifyReport, verify_levels
from cpkv_core.batch import BatchSpec
from cpkv_core.config import CpMode, DeploymentConfig, IndexKDtype, ModelConfig, model_preset
from cpkv_core.trace import Trace, load_trace
from flags import debug_benchmark_warning, resolve_flags
from phases.gate import level_plans, levels_of
from phases.registry import REGISTERED_PHASES

app = typer.Typer(
    name="cpkv",
    help="Shard the KV cache of context-parallel prefill, phase by phase.",
    no_args_is_help=True,
    add_completion=False,
)

TraceArg = Annotated[Path, typer.Argument(metavar="TRACE", help="Trace file (JSON Lines).")]
PhasesOpt = Annotated[
    str | None,
    typer.Option(
        "--phases",
        metavar="LIST",
        help="Enabled phases for this run: a list (e.g. 1,2), all or none; default: the flags.",
    ),
]
CpSizeOpt = Annotated[
    int | None,
    typer.Option("--cp-size", help="CP ranks; turns CP on for the run. Default: the flags (1)."),
]
PageSizeOpt = Annotated[
    int | None, typer.Option("--page-size", help="Tokens per KV page. Default: the flags (64).")
]
CpModeOpt = Annotated[
    CpMode | None,
    typer.Option("--cp-mode", help="How current tokens are split. Default: the flags."),
]
BackendOpt = Annotated[
    Backend, typer.Option("--backend", help="gloo: one process per rank; local: threads.")
]
ModelOpt = Annotated[
    str, typer.Option("--model", metavar="NAME", help="Model preset (runs need tiny).")
]
IndexDtypeOpt = Annotated[
    IndexKDtype, typer.Option("--index-k-dtype", help="Storage dtype of the indexer key cache.")
]


def _runnable_model(name: str) -> ModelConfig:
    model = model_preset(name)
    if name != "tiny":
        raise BadInput(f"--model {name} is for planning only; runs need --model tiny on CPU")
    return model


def _run_verify(
    trace: Trace,
    model: ModelConfig,
    settings: RunSettings,
    backend: Backend,
    show_progress: bool,
) -> VerifyReport:
    deploy = settings.deploy
    levels = {
        lv: level_plans(lv, settings.enabled, deploy, trace.batches, settings.ceiling)
        for lv in levels_of(settings.enabled)
        if settings.ceiling is None or lv <= settings.ceiling
    }
    debug = settings.debug_checks
    if not show_progress:
        return verify_levels(model, deploy, trace.batches, levels, backend, debug_checks=debug)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        description = f"levels {', '.join(map(str, levels))} on {deploy.cp_size} {backend} ranks"
        task = progress.add_task(description, total=len(trace.batches) * len(levels))

        def advance(_: BatchProgress) -> None:
            progress.advance(task)

        return verify_levels(model, deploy, trace.batches, levels, backend, advance, debug)


@app.command()
def verify(
    trace_path: TraceArg,
    phases: PhasesOpt = None,
    config: ConfigOpt = None,
    cp_size: CpSizeOpt = None,
    page_size: PageSizeOpt = None,
    cp_mode: CpModeOpt = None,
    backend: BackendOpt = Backend.GLOO,
    model_name: ModelOpt = "tiny",
    index_k_dtype: IndexDtypeOpt = IndexKDtype.FP8_E4M3,
    as_json: JsonOpt = False,
) -> None:
    """Run TRACE on CP ranks at every level 0..highest enabled phase and compare every batch
    with the non-CP reference. Exit 0 only when every batch of every level matches."""
    with bad_input_exits():
        settings = resolve_run(config, phases, cp_size, page_size, cp_mode, index_k_dtype)
        model = _runnable_model(model_name)
        trace = load_trace(trace_path, settings.deploy.page_size)
    report = _run_verify(trace, model, settings, backend, show_progress=not as_json)
    emit(as_json, report.to_json(), lambda: render_verify_table(out, report, settings.deploy))
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def explain(
    trace_path: TraceArg,
    phases: PhasesOpt = None,
    config: ConfigOpt = None,
    cp_size: CpSizeOpt = None,
    page_size: PageSizeOpt = None,
    cp_mode: CpModeOpt = None,
    batch: Annotated[
        int | None,
        typer.Option("--batch", metavar="N", help="Show batch N in full: requests, every reason."),
    ] = None,
    as_json: JsonOpt = False,
    out_dir: Annotated[Path | None, out_option("explain.json and phases-by-batch.png")] = None,
) -> None:
    """The gate's BatchPlan for every batch of TRACE, with reasons, and a summary by phase."""
    with bad_input_exits():
        settings = resolve_run(config, phases, cp_size, page_size, cp_mode)
        trace = load_trace(trace_path, settings.deploy.page_size)
    report = explain_trace(trace.batches, settings.enabled, settings.deploy, settings.ceiling)
    if batch is None:
        emit(as_json, report.to_json(), lambda: render_explain(out, report))
        if out_dir is not None:
            from cpkv.plots import write_outputs  # NOTE: loads matplotlib only for --out
            from cpkv.plots.explain_plots import EXPLAIN_FIGURES

            documents = {"explain": report.to_json()}
            print_written(write_outputs(out_dir, "explain", documents, EXPLAIN_FIGURES))
        return
    with bad_input_exits():
        i = _batch_index(report.batches, batch)
    document = report.to_json()["batches"][i]
    emit(as_json, document, lambda: render_explain_batch(out, report.batches[i], report.plans[i]))


def _batch_index(batches: tuple[BatchSpec, ...], number: int) -> int:
    numbers = [b.batch for b in batches]
    if number not in numbers:
        raise BadInput(f"--batch {number}: the trace has batches {', '.join(map(str, numbers))}")
    return numbers.index(number)


@app.command("phases")
def phases_command(
    config: ConfigOpt = None,
    cp_size: CpSizeOpt = None,
    page_size: PageSizeOpt = None,
    cp_mode: CpModeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The phases: number, name, flag, needs, enabled, available, start-up contract status."""
    with bad_input_exits():
        settings = resolve_run(config, None, cp_size, page_size, cp_mode)
    rows = phase_rows(settings.enabled, settings.deploy)
    document = {"deployment": settings.deploy.model_dump(mode="json"), "phases": rows}
    emit(as_json, document, lambda: render_phases(out, rows))


@app.command()
def bench(
    cp_size: Annotated[
        int, typer.Option("--cp-size", help="CP ranks for gate timing and the gloo step time.")
    ] = 4,
    page_size: Annotated[int, typer.Option("--page-size", help="Tokens per KV page.")] = 64,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Timed rounds per figure, after a warm-up.")
    ] = 3,
    trace_path: Annotated[
        Path | None,
        typer.Option(
            "--trace", metavar="TRACE", help="Trace to measure; default: the built-in one."
        ),
    ] = None,
    as_json: JsonOpt = False,
    out_dir: Annotated[Path | None, out_option("bench.json and one PNG per figure")] = None,
) -> None:
    """Performance figures, measured side by side in one run: bytes counted exactly, times as
    medians after a warm-up, headline figures as ratios."""
    with bad_input_exits():
        deploy = DeploymentConfig(cp_size=cp_size, page_size=page_size)
        flags = resolve_flags().flags  # the debug checks and their warning come from the env
        trace = demo_trace(page_size) if trace_path is None else load_trace(trace_path, page_size)
    warning = debug_benchmark_warning(flags)
    if warning:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    with err.status("bench") as status:
        report = run_bench(
            model_preset("tiny"),
            deploy,
            trace.batches,
            repeats,
            warnings=[warning] if warning else [],
            debug_checks=flags.debug_cp_shared_kv,
            on_step=lambda name: status.update(f"bench: {name}"),
        )
    emit(as_json, report.to_json(), lambda: render_bench(out, report))
    if out_dir is not None:
        from cpkv.plots import write_outputs  # NOTE: loads matplotlib only for --out
        from cpkv.plots.bench_plots import BENCH_FIGURES

        documents = {"bench": report.to_json()}
        print_written(write_outputs(out_dir, "bench", documents, BENCH_FIGURES))


@app.command()
def demo(
    cp_size: Annotated[int, typer.Option("--cp-size", help="CP ranks.")] = 4,
    page_size: Annotated[int, typer.Option("--page-size", help="Tokens per KV page.")] = 64,
    cp_mode: Annotated[CpMode, typer.Option("--cp-mode", help="Split mode.")] = (
        CpMode.IN_SEQ_SPLIT
    ),
    backend: BackendOpt = Backend.GLOO,
    as_json: JsonOpt = False,
) -> None:
    """The main job on built-in defaults: a built-in trace through the gate with every phase
    on, each level verified against the reference on CP ranks. Then every request goes to a
    non-CP decode process over Mooncake."""
    with bad_input_exits():
        deploy = DeploymentConfig(cp_size=cp_size, cp_mode=cp_mode, page_size=page_size)
        trace = demo_trace(page_size)
    settings = RunSettings(deploy, frozenset(REGISTERED_PHASES), None, False)
    if not as_json:
        tokens = sum(b.num_tokens for b in trace.batches)
        out.print(
            f"cpkv demo: {len(trace.batches)} batches, {tokens} tokens, model tiny, "
            f"cp_size={cp_size} {cp_mode}, page_size={page_size}, backend {backend}, "
            f"phases {','.join(str(int(p)) for p in sorted(settings.enabled))} on"
        )
    report = _run_verify(trace, model_preset("tiny"), settings, backend, not as_json)
    pd_report = _run_pd(trace, settings, timeout_s=30.0, retries=0)
    document = report.to_json() | {"pd": pd_report.to_json()}

    def render() -> None:
        render_demo(out, report, deploy)
        render_pd(out, pd_report)

    emit(as_json, document, render)
    raise typer.Exit(0 if report.ok and pd_report.ok else 1)


def _pd_job(trace: Trace, settings: RunSettings) -> PdJob:
    """The highest enabled level of ``settings`` as a PD job."""
    level = levels_of(settings.enabled)[-1]
    if settings.ceiling is not None:
        level = min(level, settings.ceiling)
    plans = level_plans(level, settings.enabled, settings.deploy, trace.batches, settings.ceiling)
    return PdJob(settings.deploy, trace.batches, (level,), (tuple(p.plan for p in plans),))


def _run_pd(trace: Trace, settings: RunSettings, timeout_s: float, retries: int) -> PdReport:
    with err.status(f"prefill on {settings.deploy.cp_size} gloo ranks, transfer to decode"):
        (report,), _ = run_pd(model_preset("tiny"), [_pd_job(trace, settings)], timeout_s, retries)
    return report


@app.command()
def pd(
    trace_path: TraceArg,
    phases: PhasesOpt = None,
    config: ConfigOpt = None,
    cp_size: CpSizeOpt = None,
    page_size: PageSizeOpt = None,
    cp_mode: CpModeOpt = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="Seconds the decode side waits for every rank of one attempt (>= 0.1).",
        ),
    ] = 30.0,
    retries: Annotated[
        int, typer.Option("--retries", min=0, help="New attempts after a failed one, per request.")
    ] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Prefill TRACE on CP ranks at the highest enabled level and send every request to a
    non-CP decode process over Mooncake (TCP loopback). Checks the rebuilt KV byte for byte
    and one decode step against the reference; exit 0 only when every request checks out."""
    with bad_input_exits():
        settings = resolve_run(config, phases, cp_size, page_size, cp_mode)
        trace = load_trace(trace_path, settings.deploy.page_size)
    report = _run_pd(trace, settings, timeout, retries)
    emit(as_json, report.to_json(), lambda: render_pd(out, report))
    raise typer.Exit(0 if report.ok else 1)


flag_commands.register(app)
plan_command.register(app)
docgen.register(app)
tidy_help(app)  # NOTE: last, so that it sees every command registered above


def main() -> None:
    """Console-script entry point."""
    app()
