"""The ``cpkv`` command line (typer + rich). Exit codes: 0 ok, 1 failed check, 2 bad input."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from cpkv import docgen, flag_commands, plan_command, trace_command
from cpkv.batch_tables import (
    render_demo,
    render_explain,
    render_explain_batch,
    render_verify_table,
)
from cpkv.bench import run_bench
from cpkv.bench_rows_command import (
    RowsGridOpt,
    RowsKvDtypeOpt,
    RowsOpt,
    RowsThreadsOpt,
    run_rows_command,
)
from cpkv.builtin_trace import demo_trace
from cpkv.console import BadInput, ConfigOpt, JsonOpt, bad_input_exits, emit, err, out
from cpkv.devices import Device, check_device
from cpkv.dry_run import dry_run_levels
from cpkv.explain import explain_trace, parse_killed
from cpkv.help_text import tidy_help
from cpkv.launchers import LauncherOpt, dist_backend, refuse_torchrun, torchrun_worker
from cpkv.out_dir import out_option, print_written
from cpkv.pd import PdHosts, PdJob, PdReport, run_pd
from cpkv.phase_table import phase_rows
from cpkv.progress import with_progress
from cpkv.report import (
    render_bench,
    render_dry_run,
    render_explain_summary,
    render_pd,
    render_phases,
)
from cpkv.runner import Backend, BatchProgress, RankJob, run_levels
from cpkv.settings import RunSettings, resolve_run
from cpkv.shadow_report import FaultOpt, ShadowRateOpt, parse_fault, shadow_summary
from cpkv.torchrun_verify import verify_on_torchrun
from cpkv.verify import VerifyReport, verify_job, verify_runs
from cpkv_core.config import (
    CpMode,
    DeploymentConfig,
    IndexKDtype,
    MaterializeMode,
    ModelConfig,
    model_preset,
)
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import Fault
from cpkv_core.traces import Trace, load_trace
from flags import debug_benchmark_warning, resolve_flags
from flags.checks import MAX_BATCH_TIMEOUT_S
from phases.gate import levels_of
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
CpMinTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--nsa-prefill-cp-min-tokens",
        metavar="N",
        help="Batches with fewer current tokens run unsplit (CP off for them); 0: always "
        "split. Default: the flags (0).",
    ),
]
MaterializeOpt = Annotated[
    MaterializeMode | None,
    typer.Option(
        "--materialize",
        help="How sharded reads build their view: gather (a collective) or peer-read (owners' "
        "pools in shared memory, ranks on one host). Default: the flags (gather).",
    ),
]
PrefetchOpt = Annotated[
    bool | None,
    typer.Option(
        "--materialize-prefetch/--no-materialize-prefetch",
        help="Fetch layer l+1's history view while layer l computes (a second view buffer). "
        "Default: the flags (off).",
    ),
]
BackendOpt = Annotated[
    Backend, typer.Option("--backend", help="gloo: one process per rank; local: threads.")
]
ModelOpt = Annotated[
    str, typer.Option("--model", metavar="NAME", help="Model preset (runs need tiny).")
]
DeviceOpt = Annotated[
    Device,
    typer.Option("--device", help="Where weights, pools and the run step live; meta: a dry run."),
]
BatchTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--batch-timeout-s",
        metavar="SECONDS",
        help="Seconds a batch's collective waits for a stalled rank; then the run stops, "
        "naming the rank and the batch. Default: the flags (60).",
    ),
]
IndexDtypeOpt = Annotated[
    IndexKDtype, typer.Option("--index-k-dtype", help="Storage dtype of the indexer key cache.")
]


def _runnable_model(name: str) -> ModelConfig:
    model = model_preset(name)
    if name != "tiny":
        raise BadInput(f"--model {name} is for planning only; runs need --model tiny on CPU")
    return model


def _levels(settings: RunSettings) -> list[int]:
    return [
        lv
        for lv in levels_of(settings.enabled)
        if settings.ceiling is None or lv <= settings.ceiling
    ]


def _verify_job(
    trace: Trace,
    model: ModelConfig,
    settings: RunSettings,
    device: Device = Device.CPU,
    fault: Fault | None = None,
) -> RankJob:
    """What every rank runs for ``cpkv verify``, whichever launcher starts the ranks."""
    return verify_job(
        model,
        settings.deploy,
        trace.batches,
        _levels(settings),
        settings.enabled,
        settings.debug_checks,
        settings.ceiling,
        str(device),
        settings.shadow_rate,
        fault,
        settings.batch_timeout_s,
    )


def _run_verify(job: RankJob, backend: Backend, show_progress: bool) -> VerifyReport:
    def run(on_progress: Callable[[BatchProgress], None] | None) -> VerifyReport:
        return verify_runs(job, run_levels(job, backend, on_progress))

    levels = job.levels
    description = f"levels {', '.join(map(str, levels))} on {job.deploy.cp_size} {backend} ranks"
    return with_progress(show_progress, description, len(job.batches) * len(levels), run)


def _render_verify(report: VerifyReport, deploy: DeploymentConfig) -> None:
    render_verify_table(out, report, deploy)
    _print_shadow(report)


@app.command()
def verify(
    trace_path: TraceArg,
    phases: PhasesOpt = None,
    config: ConfigOpt = None,
    cp_size: CpSizeOpt = None,
    page_size: PageSizeOpt = None,
    cp_mode: CpModeOpt = None,
    cp_min_tokens: CpMinTokensOpt = None,
    materialize: MaterializeOpt = None,
    materialize_prefetch: PrefetchOpt = None,
    backend: BackendOpt = Backend.GLOO,
    model_name: ModelOpt = "tiny",
    index_k_dtype: IndexDtypeOpt = IndexKDtype.FP8_E4M3,
    device: DeviceOpt = Device.CPU,
    shadow_rate: ShadowRateOpt = None,
    inject_fault: FaultOpt = None,
    batch_timeout_s: BatchTimeoutOpt = None,
    launcher: LauncherOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run TRACE on CP ranks at every level 0..highest enabled phase and compare every batch
    with the non-CP reference. Exit 0 only when every batch of every level matches. With
    --device meta, a dry run instead: every level's whole step on shapes alone, naming the
    first op that needed a value or a tensor on another device."""
    with bad_input_exits():
        settings = resolve_run(
            config,
            phases,
            cp_size,
            page_size,
            cp_mode,
            index_k_dtype,
            cp_min_tokens=cp_min_tokens,
            shadow_rate=shadow_rate,
            batch_timeout_s=batch_timeout_s,
            launcher=launcher,
            materialize=materialize,
            materialize_prefetch=materialize_prefetch,
        )
        fault = parse_fault(inject_fault)
        model = _runnable_model(model_name)
        trace = load_trace(trace_path, settings.deploy.page_size)
        check_device(device)
        worker = torchrun_worker(settings.launcher, backend, settings.deploy.cp_size, device)
    job = _verify_job(trace, model, settings, device, fault)
    if worker is not None:
        render = partial(_render_verify, deploy=settings.deploy)
        verify_on_torchrun(worker, job, dist_backend(device), as_json, render)
    if device is Device.META:
        _dry_run_exit(settings.deploy, trace, as_json, settings)
    report = _run_verify(job, backend, not as_json)
    emit(as_json, report.to_json(), lambda: _render_verify(report, settings.deploy))
    raise typer.Exit(0 if report.ok else 1)


def _print_shadow(report: VerifyReport) -> None:
    summary = shadow_summary(report)
    if summary.rate > 0 or summary.fault is not None:
        out.print(summary.text(), highlight=False, markup=False)


@app.command()
def explain(
    trace_path: TraceArg,
    phases: PhasesOpt = None,
    config: ConfigOpt = None,
    cp_size: CpSizeOpt = None,
    page_size: PageSizeOpt = None,
    cp_mode: CpModeOpt = None,
    cp_min_tokens: CpMinTokensOpt = None,
    summary: Annotated[
        bool, typer.Option("--summary", help="Only the phase mix, not every batch's plan.")
    ] = False,
    batch: Annotated[
        int | None,
        typer.Option("--batch", metavar="N", help="Show batch N in full: requests, every reason."),
    ] = None,
    killed: Annotated[
        list[str] | None,
        typer.Option(
            "--killed",
            metavar="PHASE@BATCH",
            help="Replay a kill switch a live run tripped (verify's shadow.kills): PHASE is "
            "KILLED from the batch after BATCH on. Repeatable.",
        ),
    ] = None,
    as_json: JsonOpt = False,
    out_dir: Annotated[Path | None, out_option("explain.json and phases-by-batch.png")] = None,
) -> None:
    """The gate's BatchPlan for every batch of TRACE, with reasons, and the phase mix: the
    share of batches and tokens per phase, and fallback reasons counted by code."""
    with bad_input_exits():
        settings = resolve_run(
            config, phases, cp_size, page_size, cp_mode, cp_min_tokens=cp_min_tokens
        )
        trace = load_trace(trace_path, settings.deploy.page_size)
        kills = parse_killed(killed or [], trace.batches)
    report = explain_trace(
        trace.batches, settings.enabled, settings.deploy, settings.ceiling, kills
    )
    if batch is not None:
        with bad_input_exits():
            i = _batch_index(report.batches, batch)
        document = report.to_json()["batches"][i]
        batch_plan = report.plans[i]
        emit(as_json, document, lambda: render_explain_batch(out, report.batches[i], batch_plan))
        return
    render = render_explain_summary if summary else render_explain
    emit(as_json, report.to_json(summary_only=summary), lambda: render(out, report))
    if out_dir is not None:
        from cpkv.plots import write_outputs  # NOTE: loads matplotlib only for --out
        from cpkv.plots.explain_plots import EXPLAIN_FIGURES

        documents = {"explain": report.to_json()}
        print_written(write_outputs(out_dir, "explain", documents, EXPLAIN_FIGURES))


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
    cp_min_tokens: Annotated[
        int | None,
        typer.Option(
            "--nsa-prefill-cp-min-tokens",
            metavar="N",
            min=0,
            help="The cp_off figure's bytes: batches below N tokens, CP on vs off. Default: "
            "the trace's median batch size.",
        ),
    ] = None,
    device: DeviceOpt = Device.CPU,
    as_json: JsonOpt = False,
    out_dir: Annotated[Path | None, out_option("bench.json and one PNG per figure")] = None,
    rows: RowsOpt = None,
    rows_grid: RowsGridOpt = "full",
    kv_cache_dtype: RowsKvDtypeOpt = "auto",
    rows_threads: RowsThreadsOpt = 0,
) -> None:
    """Performance figures, measured side by side in one run: bytes counted exactly, times as
    medians after a warm-up, headline figures as ratios. With --device meta, a dry run of
    levels 0-5 on the trace instead. With --rows MODEL, the data movement at MODEL's row
    widths and lengths against the device's copy rate instead."""
    if rows is not None:
        run_rows_command(
            rows, rows_grid, kv_cache_dtype, rows_threads, repeats, device, as_json, out_dir
        )
    with bad_input_exits():
        deploy = DeploymentConfig(cp_size=cp_size, page_size=page_size)
        flags = resolve_flags().flags  # the debug checks and their warning come from the env
        trace = demo_trace(page_size) if trace_path is None else load_trace(trace_path, page_size)
        check_device(device)
        refuse_torchrun("cpkv bench", flags.launcher)
    if device is Device.META:
        _dry_run_exit(deploy, trace, as_json)
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
            device=str(device),
            cp_min_tokens=cp_min_tokens,
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
    device: DeviceOpt = Device.CPU,
    shadow_rate: ShadowRateOpt = None,
    inject_fault: FaultOpt = None,
    batch_timeout_s: BatchTimeoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The main job on built-in defaults: a built-in trace through the gate with every phase
    on, each level verified against the reference on CP ranks. Then every request goes to a
    non-CP decode process over Mooncake. With --device meta, a dry run of every level instead."""
    with bad_input_exits():
        deploy = DeploymentConfig(cp_size=cp_size, cp_mode=cp_mode, page_size=page_size)
        flags = resolve_flags().flags  # NOTE: the debug checks come from the environment
        rate = flags.shadow_rate if shadow_rate is None else shadow_rate
        if not 0.0 <= rate <= 1.0:
            raise BadInput(f"--shadow-rate must be in 0..1, got {rate}")
        timeout = flags.batch_timeout_s if batch_timeout_s is None else batch_timeout_s
        if not 0.0 < timeout <= MAX_BATCH_TIMEOUT_S:
            raise BadInput(
                f"--batch-timeout-s must be in (0, {MAX_BATCH_TIMEOUT_S:g}] seconds, got {timeout}"
            )
        fault = parse_fault(inject_fault)
        trace = demo_trace(page_size)
        check_device(device)
        refuse_torchrun("cpkv demo", flags.launcher)
    if device is Device.META:
        _dry_run_exit(deploy, trace, as_json)
    settings = RunSettings(
        deploy,
        frozenset(REGISTERED_PHASES),
        None,
        flags.debug_cp_shared_kv,
        rate,
        timeout,
        flags.launcher,
        flags.pd_host,
        flags.pd_local_host,
    )
    if not as_json:
        tokens = sum(b.num_tokens for b in trace.batches)
        out.print(
            f"cpkv demo: {len(trace.batches)} batches, {tokens} tokens, model tiny, "
            f"cp_size={cp_size} {cp_mode}, page_size={page_size}, backend {backend}, "
            f"phases {','.join(str(int(p)) for p in sorted(settings.enabled))} on"
        )
    job = _verify_job(trace, model_preset("tiny"), settings, device, fault)
    report = _run_verify(job, backend, not as_json)
    pd_report = _run_pd(trace, settings, timeout_s=30.0, retries=0, fault=fault)
    document = report.to_json() | {"pd": pd_report.to_json()}

    def render() -> None:
        render_demo(out, report, deploy)
        _print_shadow(report)
        render_pd(out, pd_report)

    emit(as_json, document, render)
    raise typer.Exit(0 if report.ok and pd_report.ok else 1)


def _pd_job(trace: Trace, settings: RunSettings, fault: Fault | None = None) -> PdJob:
    """The highest enabled level of ``settings`` as a PD job."""
    level = levels_of(settings.enabled)[-1]
    if settings.ceiling is not None:
        level = min(level, settings.ceiling)
    return PdJob(
        settings.deploy,
        trace.batches,
        (level,),
        settings.enabled,
        settings.ceiling,
        settings.debug_checks,
        settings.shadow_rate,
        fault,
        batch_timeout_s=settings.batch_timeout_s,
    )


def _run_pd(
    trace: Trace,
    settings: RunSettings,
    timeout_s: float,
    retries: int,
    fault: Fault | None = None,
) -> PdReport:
    with err.status(f"prefill on {settings.deploy.cp_size} gloo ranks, transfer to decode"):
        job = _pd_job(trace, settings, fault)
        hosts = PdHosts(settings.pd_host, settings.pd_local_host)
        (report,), _ = run_pd(model_preset("tiny"), [job], timeout_s, retries, hosts=hosts)
    return report


@app.command()
def pd(
    trace_path: TraceArg,
    phases: PhasesOpt = None,
    config: ConfigOpt = None,
    cp_size: CpSizeOpt = None,
    page_size: PageSizeOpt = None,
    cp_mode: CpModeOpt = None,
    cp_min_tokens: CpMinTokensOpt = None,
    materialize: MaterializeOpt = None,
    materialize_prefetch: PrefetchOpt = None,
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
    device: DeviceOpt = Device.CPU,
    shadow_rate: ShadowRateOpt = None,
    inject_fault: FaultOpt = None,
    batch_timeout_s: BatchTimeoutOpt = None,
    pd_host: Annotated[
        str | None,
        typer.Option(
            "--pd-host",
            metavar="HOST",
            help="Address the decode server listens on and is reached at. Default: the flags "
            "(127.0.0.1).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Prefill TRACE on CP ranks at the highest enabled level and send every request to a
    non-CP decode process over Mooncake (TCP, at --pd-host). Checks the rebuilt KV byte for byte
    and one decode step against the reference; exit 0 only when every request checks out.
    --device meta: a dry run of the prefill."""
    with bad_input_exits():
        settings = resolve_run(
            config,
            phases,
            cp_size,
            page_size,
            cp_mode,
            cp_min_tokens=cp_min_tokens,
            shadow_rate=shadow_rate,
            batch_timeout_s=batch_timeout_s,
            pd_host=pd_host,
            materialize=materialize,
            materialize_prefetch=materialize_prefetch,
        )
        fault = parse_fault(inject_fault)
        trace = load_trace(trace_path, settings.deploy.page_size)
        check_device(device)
        refuse_torchrun("cpkv pd", settings.launcher)
        if device is Device.CUDA:
            raise BadInput(
                "cpkv pd --device cuda needs Mooncake's CUDA build to register GPU pools; the "
                "pd extra installs the CPU build (mooncake-transfer-engine-non-cuda)"
            )
    if device is Device.META:
        _dry_run_exit(settings.deploy, trace, as_json, settings)
    report = _run_pd(trace, settings, timeout, retries, fault)

    def render() -> None:
        render_pd(out, report)
        if report.shadow is not None:
            out.print(report.shadow.text(), highlight=False, markup=False)

    emit(as_json, report.to_json(), render)
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def fuzz(
    minutes: Annotated[
        float, typer.Option("--minutes", min=0.001, help="How long to fuzz, shared by the targets.")
    ] = 1.0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Hypothesis seed; default: a fresh one.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fuzz every input cpkv reads (traces, config files, flag values, --from-sglang strings,
    the forward-batch adapter) with hypothesis. A case passes when it gives a result or a
    clear error (exit 2 with the line or key named). Exit 0 only when no case failed."""
    from cpkv.fuzz import run_fuzz  # NOTE: loads hypothesis (the dev extra) only here

    with bad_input_exits():
        try:
            report = run_fuzz(minutes * 60.0, seed)
        except ModuleNotFoundError as exc:
            raise BadInput(f"cpkv fuzz needs hypothesis (the dev extra): {exc}") from None
    document = report.to_json()

    def render() -> None:
        out.print(
            f"fuzz: {document['cases']:,} cases in {document['seconds']:.1f} s, "
            f"{document['failures']} failures",
            highlight=False,
        )
        for name, target in document["targets"].items():
            out.print(f"  {name}: {target['cases']:,} cases, {target['failures']} failures")
            for example in target["examples"][:3]:
                out.print(f"    {escape(example)}", highlight=False)

    emit(as_json, document, render)
    raise typer.Exit(0 if report.ok else 1)


def _dry_run_exit(
    deploy: DeploymentConfig, trace: Trace, as_json: bool, settings: RunSettings | None = None
) -> None:
    """Runs every level's step on ``meta`` (all phases unless ``settings`` say otherwise),
    prints the report and exits 0 when every level ran."""
    if settings is None:
        settings = RunSettings(deploy, frozenset(REGISTERED_PHASES), None, False)
    report = dry_run_levels(model_preset("tiny"), settings, trace.batches)
    emit(as_json, report.to_json(), lambda: render_dry_run(out, report))
    raise typer.Exit(0 if report.ok else 1)


flag_commands.register(app)
plan_command.register(app)
app.add_typer(trace_command.app)
docgen.register(app)
tidy_help(app)  # NOTE: last, so that it sees every command registered above


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
