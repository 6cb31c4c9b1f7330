"""``cpkv migrate``: an SGLang launch command's rollout, level 0 up; :func:`register` adds it.

Exit codes: 0 the rollout (however far SGLang 0.5.23 can take it); 1 SGLang or cpkv would
refuse the command given, so nothing is migrated (every problem listed, as ``cpkv flags
--from-sglang`` lists them); 2 bad input (a command SGLang's parser refuses, an option out
of range).
"""

from __future__ import annotations

from typing import Annotated

import typer

from cpkv.commands.options import JsonOpt
from cpkv.common.console import BadInput, bad_input_exits, emit, out
from cpkv.migrate import (
    DEFAULT_GPU_MEM_GIB,
    MigrateOptions,
    Refusal,
    migration_json,
    plan_migration,
    refusal_json,
)
from cpkv.render.migrate import render_migration, render_refusal

MigrateFromOpt = Annotated[
    str,
    typer.Option(
        "--from-sglang",
        metavar="ARGS",
        help="The SGLang 0.5.23 launch command to migrate, as one string.",
    ),
]
MigrateModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="PRESET",
        help="The model preset whose SGLang rules and sizes apply "
        "(default: the one --model-path names).",
    ),
]
MigrateGpuOpt = Annotated[
    float,
    typer.Option(
        "--gpu-mem-gib",
        help="GPU memory per rank for the token figures, in GiB (default: an H200 as SGLang "
        "reads it, 143,771 MiB).",
        show_default=False,
    ),
]
MigrateShadowOpt = Annotated[
    float | None,
    typer.Option(
        "--shadow-rate",
        help="Share of batches the plugin runs twice and compares, 0..1 (default: the "
        "command's CPKV_SHADOW_RATE, else 0.01); 0 leaves it off.",
    ),
]
MigrateConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--plugin-config",
        metavar="PATH",
        help="A cpkv config file on the server for the plugin to read (sets CPKV_CONFIG).",
    ),
]


def migrate_command(
    from_sglang: MigrateFromOpt,
    model: MigrateModelOpt = None,
    gpu_mem_gib: MigrateGpuOpt = DEFAULT_GPU_MEM_GIB,
    shadow_rate: MigrateShadowOpt = None,
    plugin_config: MigrateConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The steps that move an SGLang server from replicated KV to the highest level SGLang
    0.5.23 runs: each step's command, what it adds, needs and changes, its tokens, its
    rollback; phases 4-5 as cpkv-engine-only. Exits 1 when the command would not start."""
    with bad_input_exits():
        if shadow_rate is not None and not 0.0 <= shadow_rate <= 1.0:
            raise BadInput(f"--shadow-rate must be a share of batches in 0..1, got {shadow_rate}")
        if gpu_mem_gib <= 0:
            raise BadInput(f"--gpu-mem-gib must be above 0, got {gpu_mem_gib}")
        options = MigrateOptions(model, gpu_mem_gib, shadow_rate, plugin_config)
        result = plan_migration(from_sglang, options)
    if isinstance(result, Refusal):
        refused = refusal_json(result)
        emit(as_json, refused, lambda: render_refusal(out, refused))
        raise typer.Exit(1)
    document = migration_json(result)
    emit(as_json, document, lambda: render_migration(out, document))


def register(app: typer.Typer) -> None:
    """Adds ``migrate`` to ``app``."""
    app.command("migrate")(migrate_command)
