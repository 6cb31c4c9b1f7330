"""``cpkv phases``: one row per phase with its flag, needs, state and start-up contract."""

from __future__ import annotations

from typing import Any

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
