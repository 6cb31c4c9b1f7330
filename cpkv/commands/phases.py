"""``cpkv phases``: one row per phase with its flag, needs, state and start-up contract."""

from __future__ import annotations

from typing import Any

import typer

from cpkv.commands.options import JsonOpt, RunOptions, takes_run_options
from cpkv.common.console import bad_input_exits, emit, out
from cpkv.render.reports import render_phases
from cpkv_core.config import DeploymentConfig
from flags import PHASE_FLAGS
from phases.base import check_startup
from phases.ids import PHASE_NEEDS, PhaseId
from phases.registry import REGISTERED_PHASES


def phase_rows(enabled: frozenset[PhaseId], deploy: DeploymentConfig) -> list[dict[str, Any]]:
    """Rows for every phase 1..5; ``startup_ok`` is None for a phase without mechanics."""
    rows = []
    for pid in PhaseId:
        phase = REGISTERED_PHASES.get(pid)
        reasons = [str(r) for r in check_startup(phase, deploy)] if phase else []
        rows.append(
            {
                "phase": int(pid),
                "name": pid.label,
                "flag": PHASE_FLAGS[pid],
                "needs": [int(n) for n in PHASE_NEEDS[pid]],
                "enabled": pid in enabled,
                "available": phase is not None,
                "summary": phase.summary if phase else "",
                "startup_ok": (not reasons) if phase else None,
                "startup_reasons": reasons,
            }
        )
    return rows


@takes_run_options("config", "cp_size", "page_size", "cp_mode")
def phases_command(run: RunOptions, as_json: JsonOpt = False) -> None:
    """The phases: number, name, flag, needs, enabled, available, start-up contract status."""
    with bad_input_exits():
        settings = run.settings()
    rows = phase_rows(settings.enabled, settings.deploy)
    document = {"deployment": settings.deploy.model_dump(mode="json"), "phases": rows}
    emit(as_json, document, lambda: render_phases(out, rows))


def register(app: typer.Typer) -> None:
    """Adds ``phases`` to ``app``."""
    app.command("phases")(phases_command)
