"""The ``cpkv`` command line (typer + rich). Exit codes: 0 ok, 1 failed check, 2 bad input."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cpkv.report import render_verify_table
from cpkv.runner import Backend, BatchProgress
from cpkv.verify import VerifyReport, verify_levels
from cpkv_core.batch import BatchSpec
from cpkv_core.config import CpMode, DeploymentConfig, IndexKDtype, ModelConfig, model_preset
from cpkv_core.plan import ExecutionPlan
from cpkv_core.trace import Trace, TraceError, load_trace, parse_trace_text

app = typer.Typer(
    name="cpkv",
    help="Shard the KV cache of context-parallel prefill, phase by phase.",
    no_args_is_help=True,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)

DEMO_TRACE = "data/demo_trace.jsonl"

CpSizeOpt = Annotated[int, typer.Option("--cp-size", help="CP ranks sharing a prefill chunk.")]
PageSizeOpt = Annotated[int, typer.Option("--page-size", help="Tokens per KV page.")]
CpModeOpt = Annotated[CpMode, typer.Option("--cp-mode", help="How current tokens are split.")]
BackendOpt = Annotated[
    Backend, typer.Option("--backend", help="gloo: one process per rank; local: threads.")
]
ModelOpt = Annotated[str, typer.Option("--model", help="Model preset (tiny runs on CPU).")]
IndexDtypeOpt = Annotated[
    IndexKDtype, typer.Option("--index-k-dtype", help="Storage dtype of the indexer key cache.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


class BadInput(Exception):
    """Bad input or usage: reported on stderr, exit code 2."""


@contextmanager
def _bad_input_exits() -> Iterator[None]:
    try:
        yield
    except (BadInput, TraceError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        err.print(f"[red]error:[/red] {where}: {first['msg']}", highlight=False)
        raise typer.Exit(2) from exc


def _deployment(
    cp_size: int, cp_mode: CpMode, page_size: int, dtype: IndexKDtype
) -> DeploymentConfig:
    return DeploymentConfig(
        cp_size=cp_size, cp_mode=cp_mode, page_size=page_size, index_k_dtype=dtype
    )


def _model(name: str) -> ModelConfig:
    try:
        model = model_preset(name)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    if name != "tiny":
        raise BadInput(f"--model {name} is for planning only; runs need --model tiny on CPU")
    return model


def _baseline_levels(
    batches: tuple[BatchSpec, ...], deploy: DeploymentConfig
) -> dict[int, tuple[ExecutionPlan, ...]]:
    return {0: tuple(ExecutionPlan.baseline(deploy.cp_mode) for _ in batches)}


def _run_verify(
    trace: Trace,
    model: ModelConfig,
    deploy: DeploymentConfig,
    backend: Backend,
    show_progress: bool,
) -> VerifyReport:
    levels = _baseline_levels(trace.batches, deploy)
    total = len(trace.batches) * len(levels)
    if not show_progress:
        return verify_levels(model, deploy, trace.batches, levels, backend)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"prefill on {deploy.cp_size} {backend} ranks", total=total)

        def advance(_: BatchProgress) -> None:
            progress.advance(task)

        return verify_levels(model, deploy, trace.batches, levels, backend, on_progress=advance)


def _emit(as_json: bool, document: dict[str, Any], render: Callable[[], None]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        render()


@app.command()
def verify(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="Trace file (JSON Lines).")],
    cp_size: CpSizeOpt = 2,
    page_size: PageSizeOpt = 64,
    cp_mode: CpModeOpt = CpMode.IN_SEQ_SPLIT,
    backend: BackendOpt = Backend.GLOO,
    model_name: ModelOpt = "tiny",
    index_k_dtype: IndexDtypeOpt = IndexKDtype.FP8_E4M3,
    as_json: JsonOpt = False,
) -> None:
    """Run TRACE on CP ranks and compare every batch with the non-CP reference."""
    with _bad_input_exits():
        deploy = _deployment(cp_size, cp_mode, page_size, index_k_dtype)
        model = _model(model_name)
        trace = load_trace(trace_path, page_size)
    report = _run_verify(trace, model, deploy, backend, show_progress=not as_json)
    _emit(as_json, report.to_json(), lambda: render_verify_table(out, report, deploy))
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def demo(
    cp_size: CpSizeOpt = 4,
    page_size: PageSizeOpt = 64,
    cp_mode: CpModeOpt = CpMode.IN_SEQ_SPLIT,
    backend: BackendOpt = Backend.GLOO,
    as_json: JsonOpt = False,
) -> None:
    """The main job on built-in defaults: a built-in trace on a real gloo group, verified."""
    with _bad_input_exits():
        deploy = _deployment(cp_size, cp_mode, page_size, IndexKDtype.FP8_E4M3)
        text = files("cpkv").joinpath(DEMO_TRACE).read_text()
        trace = parse_trace_text(text, page_size, source=f"cpkv/{DEMO_TRACE}")
    model = model_preset("tiny")
    if not as_json:
        tokens = sum(b.num_tokens for b in trace.batches)
        out.print(
            f"cpkv demo: {len(trace.batches)} batches, {tokens} tokens, model tiny, "
            f"cp_size={cp_size} {cp_mode}, page_size={page_size}, backend {backend}"
        )
    report = _run_verify(trace, model, deploy, backend, show_progress=not as_json)
    _emit(as_json, report.to_json(), lambda: render_verify_table(out, report, deploy))
    raise typer.Exit(0 if report.ok else 1)


def main() -> None:
    """Console-script entry point."""
    app()
