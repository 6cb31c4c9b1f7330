"""``cpkv demo``: the main job on built-in defaults: the built-in trace verified at every
level on CP ranks, then every request sent to a non-CP decode process over Mooncake."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer

from cpkv.commands.options import (
    BackendOpt,
    BatchTimeoutOpt,
    DeviceOpt,
    FaultOpt,
    JsonOpt,
    ShadowRateOpt,
)
from cpkv.commands.shared import RUN_MODEL, dry_run_exit, run_pd_job, run_verify
from cpkv.common.console import BadInput, bad_input_exits, emit, out
from cpkv.common.devices import Device, check_device
from cpkv.common.settings import RunSettings
from cpkv.render.batches import print_failures, print_shadow, render_demo
from cpkv.render.reports import render_pd
from cpkv.run.builtin_trace import demo_trace
from cpkv.run.jobs import Backend
from cpkv.run.launchers import refuse_torchrun
from cpkv.run.shadow import check_fault_batch, parse_fault
from cpkv.run.verify import verify_job
from cpkv_core.config import CpMode, DeploymentConfig, model_preset
from flags import FlagSet, resolve_flags
from flags.checks import MAX_BATCH_TIMEOUT_S
from phases.registry import REGISTERED_PHASES

CpSizeOpt = Annotated[int, typer.Option("--cp-size", help="CP ranks.")]
PageSizeOpt = Annotated[int, typer.Option("--page-size", help="Tokens per KV page.")]
CpModeOpt = Annotated[CpMode, typer.Option("--cp-mode", help="Split mode.")]


def _demo_settings(
    deploy: DeploymentConfig, flags: FlagSet, shadow_rate: float | None, timeout: float | None
) -> RunSettings:
    """Every phase on; the debug checks and the launcher from the environment's flags, the
    shadow rate and the batch timeout from the options when given.

    Raises:
        BadInput: a shadow rate or a batch timeout out of range.
    """
    rate = flags.shadow_rate if shadow_rate is None else shadow_rate
    if not 0.0 <= rate <= 1.0:
        raise BadInput(f"--shadow-rate must be in 0..1, got {rate}")
    timeout = flags.batch_timeout_s if timeout is None else timeout
    if not 0.0 < timeout <= MAX_BATCH_TIMEOUT_S:
        raise BadInput(
            f"--batch-timeout-s must be in (0, {MAX_BATCH_TIMEOUT_S:g}] seconds, got {timeout}"
        )
    return RunSettings(
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


def demo_command(
    cp_size: CpSizeOpt = 4,
    page_size: PageSizeOpt = 64,
    cp_mode: CpModeOpt = CpMode.IN_SEQ_SPLIT,
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
        settings = _demo_settings(deploy, flags, shadow_rate, batch_timeout_s)
        settings = replace(settings, device=str(device), fault=parse_fault(inject_fault))
        trace = demo_trace(page_size)
        check_fault_batch(settings.fault, trace.batches)
        check_device(device)
        refuse_torchrun("cpkv demo", flags.launcher)
    if device is Device.META:
        dry_run_exit(settings, trace.batches, as_json)
    if not as_json:
        tokens = sum(b.num_tokens for b in trace.batches)
        out.print(
            f"cpkv demo: {len(trace.batches)} batches, {tokens} tokens, model tiny, "
            f"cp_size={cp_size} {cp_mode}, page_size={page_size}, backend {backend}, "
            f"phases {','.join(str(int(p)) for p in sorted(settings.enabled))} on"
        )
    job = verify_job(model_preset(RUN_MODEL), settings, trace.batches)
    report = run_verify(job, backend, not as_json)
    pd_report = run_pd_job(settings, trace.batches, timeout_s=30.0, retries=0)
    document = report.to_json() | {"pd": pd_report.to_json()}

    def render() -> None:
        render_demo(out, report, deploy)
        print_shadow(out, report)
        render_pd(out, pd_report)
        print_failures(out, pd_report.failures, "pd prefill failures")

    emit(as_json, document, render)
    raise typer.Exit(0 if report.ok and pd_report.ok else 1)


def register(app: typer.Typer) -> None:
    """Adds ``demo`` to ``app``."""
    app.command("demo")(demo_command)
