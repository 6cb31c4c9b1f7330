"""``cpkv bench``: the performance figures, measured side by side in one run (the figures are
:mod:`cpkv.bench`'s; their tables :mod:`cpkv.render.bench`'s); with ``--rows MODEL`` the
real-rows figures (``bench.rows``) instead."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.markup import escape

from cpkv.bench.rows import PLACEMENTS, ROWS_REPEATS, run_rows_bench
from cpkv.bench.rows.setup import GRIDS
from cpkv.bench.sections import SECTIONS, section_names
from cpkv.bench.suite import SectionTime, run_bench
from cpkv.commands.options import DeviceOpt, JsonOpt, out_option, print_written
from cpkv.commands.shared import RANK_MODULES, RUN_MODEL, dry_run_exit
from cpkv.common.console import BadInput, bad_input_exits, emit, err, out
from cpkv.common.devices import Device, check_device
from cpkv.common.settings import RunSettings
from cpkv.plan.kv_bytes import parse_kv_cache_dtype
from cpkv.render.bench import render_bench
from cpkv.render.rows import render_rows
from cpkv.run.builtin_trace import demo_trace
from cpkv.run.launchers import refuse_torchrun
from cpkv_core.config import DeploymentConfig, model_preset
from cpkv_core.dist import forked_ranks
from cpkv_core.traces import load_trace
from flags import debug_benchmark_warning, resolve_flags
from phases.registry import REGISTERED_PHASES

CpSizeOpt = Annotated[
    int, typer.Option("--cp-size", help="CP ranks for gate timing and the gloo step time.")
]
PageSizeOpt = Annotated[int, typer.Option("--page-size", help="Tokens per KV page.")]
BENCH_REPEATS = 3
"""``--repeats`` of the tiny model's figures."""
RepeatsOpt = Annotated[
    int | None,
    typer.Option(
        "--repeats",
        min=1,
        show_default=False,
        help=f"Timed rounds per figure, after a warm-up (default {BENCH_REPEATS}; with --rows, "
        f"the least rounds of each op in each pass, default {ROWS_REPEATS}).",
    ),
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

OnlyOpt = Annotated[
    str | None,
    typer.Option(
        "--only",
        metavar="SECTION[,SECTION]",
        help=f"Run these sections alone (default: every one): {', '.join(section_names())}.",
    ),
]

RowsOpt = Annotated[
    str | None,
    typer.Option(
        "--rows",
        metavar="MODEL",
        help="Instead of the tiny model's figures: cpkv's data movement at MODEL's row widths "
        "and lengths (deepseek-v3.2, glm-5), against the device's copy rate "
        "(docs/real-rows.md).",
    ),
]
RowsGridOpt = Annotated[
    str,
    typer.Option(
        "--rows-grid",
        metavar="GRID",
        help="With --rows: full (history 8K/32K/128K, chunk 8K, bs 1/4, cp 2/4/8; minutes), "
        "small (history 1K/4K, chunk 2K, bs 1/4, cp 2/4) or tiny (history 128, chunk 256, "
        "bs 1/2, cp 2, page 16; a smoke test).",
    ),
]
RowsKvDtypeOpt = Annotated[
    str,
    typer.Option(
        "--kv-cache-dtype",
        metavar="DTYPE",
        help="With --rows: the latent's storage, auto|bf16|fp8_e4m3 (auto = bf16, as cpkv "
        "plan counts it).",
    ),
]
RowsThreadsOpt = Annotated[
    int,
    typer.Option(
        "--rows-threads",
        min=0,
        metavar="N",
        help="With --rows: torch threads of the run (0: torch's default, one a core). With "
        "1 (the default) each op and its copy run on one thread, timed round by round on "
        "its CPU time, steady on a machine other work shares; with more, on the wall clock.",
    ),
]
RowsPassesOpt = Annotated[
    int,
    typer.Option(
        "--rows-passes",
        min=1,
        metavar="N",
        help="With --rows: passes over the grid, each building every point's buffers afresh; "
        "every entry pools the rounds of all of them (where an op's buffers land moves its "
        "time; more passes sample more placements).",
    ),
]


def bench_command(
    cp_size: CpSizeOpt = 4,
    page_size: PageSizeOpt = 64,
    repeats: RepeatsOpt = None,
    trace_path: TraceOpt = None,
    cp_min_tokens: CpMinTokensOpt = None,
    device: DeviceOpt = Device.CPU,
    as_json: JsonOpt = False,
    out_dir: Annotated[Path | None, out_option("bench.json and one PNG per figure")] = None,
    rows: RowsOpt = None,
    rows_grid: RowsGridOpt = "full",
    kv_cache_dtype: RowsKvDtypeOpt = "auto",
    rows_threads: RowsThreadsOpt = 1,
    rows_passes: RowsPassesOpt = PLACEMENTS,
    only: OnlyOpt = None,
) -> None:
    """Performance figures, measured side by side in one run: bytes counted exactly, times as
    medians after a warm-up, headline figures as ratios. With --device meta, a dry run of
    levels 0-5 on the trace instead. With --rows MODEL, the data movement at MODEL's row
    widths and lengths against the device's copy rate instead."""
    if rows is not None:
        if only is not None:
            with bad_input_exits():
                raise BadInput("--only picks sections of the tiny model's figures; --rows has none")
        run_rows_command(
            rows,
            rows_grid,
            kv_cache_dtype,
            rows_threads,
            rows_passes,
            repeats,
            device,
            as_json,
            out_dir,
        )
    with bad_input_exits():
        deploy = DeploymentConfig(cp_size=cp_size, page_size=page_size)
        flags = resolve_flags().flags  # the debug checks and their warning come from the env
        trace = demo_trace(page_size) if trace_path is None else load_trace(trace_path, page_size)
        check_device(device)
        refuse_torchrun("cpkv bench", flags.launcher)
        sections = _sections(only)
    if device is Device.META:
        every_phase = RunSettings(deploy, frozenset(REGISTERED_PHASES), None, False)
        dry_run_exit(every_phase, trace.batches, as_json)
    warning = debug_benchmark_warning(flags)
    if warning:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    # NOTE: every rank forks from one server that imported torch once (seconds a process).
    with err.status("bench") as status, forked_ranks(RANK_MODULES):
        report = run_bench(
            SECTIONS,
            model_preset(RUN_MODEL),
            deploy,
            trace.batches,
            BENCH_REPEATS if repeats is None else repeats,
            warnings=[warning] if warning else [],
            debug_checks=flags.debug_cp_shared_kv,
            on_step=lambda name: status.update(f"bench: {name}"),
            device=str(device),
            cp_min_tokens=cp_min_tokens,
            only=sections,
            on_section=_print_section,
        )
    emit(as_json, report.to_json(), lambda: render_bench(out, report))
    if out_dir is not None:
        from cpkv.plots import write_outputs  # NOTE: loads matplotlib only for --out
        from cpkv.plots.bench_plots import BENCH_FIGURES

        documents = {"bench": report.to_json()}
        print_written(write_outputs(out_dir, "bench", documents, BENCH_FIGURES))


def _sections(only: str | None) -> list[str] | None:
    """The sections ``--only`` names (None: every one); a name that is none is bad input."""
    if only is None:
        return None
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in section_names()]
    if unknown or not names:
        raise BadInput(
            f"--only {only!r}: {', '.join(unknown) or 'no section'} is not a bench section; "
            f"choose from {', '.join(section_names())}"
        )
    return names


def _print_section(spent: SectionTime) -> None:
    """One progress line on stderr per section, with its wall time."""
    err.print(f"bench: {spent.name} {spent.seconds:.1f} s", highlight=False)


def _check_rows(rows: str, grid: str, device: Device, out_dir: Path | None) -> None:
    model_preset(rows)
    if grid not in GRIDS:
        raise BadInput(f"--rows-grid {grid!r}: choose one of {', '.join(GRIDS)}")
    if device is Device.META:
        raise BadInput("--rows times real data movement; --device meta moves none")
    if out_dir is not None:
        raise BadInput("--out draws the tiny model's figures; with --rows use --json")
    check_device(device)


def run_rows_command(
    rows: str,
    grid: str,
    kv_cache_dtype: str,
    threads: int,
    passes: int,
    repeats: int | None,
    device: Device,
    as_json: bool,
    out_dir: Path | None,
) -> None:
    """Runs the real-rows figures and prints them (exit 2 on bad input, nothing run)."""
    with bad_input_exits():
        _check_rows(rows, grid, device, out_dir)
        kv_dtype = parse_kv_cache_dtype(kv_cache_dtype)
    model = model_preset(rows)
    if threads:
        torch.set_num_threads(threads)
    with err.status("bench --rows") as status:
        report = run_rows_bench(
            model,
            kv_dtype,
            GRIDS[grid],
            ROWS_REPEATS if repeats is None else repeats,
            str(device),
            on_step=lambda name: status.update(f"bench: {name}"),
            placements=passes,
        )
    emit(as_json, report.to_json(), lambda: render_rows(out, report))
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    """Adds ``bench`` to ``app``."""
    app.command("bench")(bench_command)
