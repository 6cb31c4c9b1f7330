"""The phases whose mechanics exist; a phase is registered only with its mechanics."""

from __future__ import annotations

from phases.base import Phase
from phases.ids import PhaseId
from phases.p1_narrow_output import NarrowOutput

REGISTERED_PHASES: dict[PhaseId, Phase] = {
    PhaseId.NARROW_OUTPUT: NarrowOutput(),
}
