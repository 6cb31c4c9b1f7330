"""``cpkv bench --rows MODEL``: the options and the run of the real-rows figures
(``bench_rows``), which replace the tiny model's figures in that run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch
import typer

from cpkv.bench_rows import run_rows_bench
from cpkv.bench_rows_setup import GRIDS
from cpkv.console import BadInput, bad_input_exits, emit, err, out
from cpkv.devices import Device, check_device
from cpkv.kv_bytes import parse_kv_cache_dtype
from cpkv.report_rows import render_rows
from cpkv_core.config import model_preset

__all__ = ["RowsGridOpt", "RowsKvDtypeOpt", "RowsOpt", "RowsThreadsOpt", "run_rows_command"]

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
        help="With --rows: torch threads of the run (0: torch's default, one a core). 1 "
        "gives steadier figures on a machine other work shares.",
    ),
]


def _check(rows: str, grid: str, device: Device, out_dir: Path | None) -> None:
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
    repeats: int,
    device: Device,
    as_json: bool,
    out_dir: Path | None,
) -> None:
    """Runs the real-rows figures and prints them (exit 2 on bad input, nothing run)."""
    with bad_input_exits():
        _check(rows, grid, device, out_dir)
        kv_dtype = parse_kv_cache_dtype(kv_cache_dtype)
    model = model_preset(rows)
    if threads:
        torch.set_num_threads(threads)
    with err.status("bench --rows") as status:
        report = run_rows_bench(
            model,
            kv_dtype,
            GRIDS[grid],
            repeats,
            str(device),
            on_step=lambda name: status.update(f"bench: {name}"),
        )
    emit(as_json, report.to_json(), lambda: render_rows(out, report))
    raise typer.Exit(0)
