"""Phases, the "when" layer: per-phase contracts and the runtime gate; entry point ``Gate``."""

from phases.base import Phase, StartupContract, check_startup
from phases.cp_off import cp_off_reason, runs_unsplit
from phases.gate import (
    BatchPlan,
    Gate,
    PhaseDecision,
    level_enabled,
    levels_of,
    startup_problems,
)
from phases.ids import PHASE_NEEDS, PhaseId, closure_of_needs, parse_phase_list
from phases.reasons import Reason, ReasonCode
from phases.registry import REGISTERED_PHASES

__all__ = [
    "PHASE_NEEDS",
    "REGISTERED_PHASES",
    "BatchPlan",
    "Gate",
    "Phase",
    "PhaseDecision",
    "PhaseId",
    "Reason",
    "ReasonCode",
    "StartupContract",
    "check_startup",
    "closure_of_needs",
    "cp_off_reason",
    "level_enabled",
    "levels_of",
    "parse_phase_list",
    "runs_unsplit",
    "startup_problems",
]
