"""Phase numbers, names and the phases each one needs."""

from __future__ import annotations

from enum import IntEnum


class PhaseId(IntEnum):
    """The five migration phases; 0 (the replicated baseline) is not a phase."""

    NARROW_OUTPUT = 1
    SHARDED_KV = 2
    CURRENT_REUSE = 3
    PAGE_ALIGNED_SPLIT = 4
    COMPUTE_OWNER_WRITE = 5

    @property
    def label(self) -> str:
        """Kebab-case name, e.g. ``narrow-output``."""
        return self.name.lower().replace("_", "-")


PHASE_NEEDS: dict[PhaseId, tuple[PhaseId, ...]] = {
    PhaseId.NARROW_OUTPUT: (),
    PhaseId.SHARDED_KV: (),
    PhaseId.CURRENT_REUSE: (PhaseId.SHARDED_KV,),
    PhaseId.PAGE_ALIGNED_SPLIT: (PhaseId.SHARDED_KV,),
    PhaseId.COMPUTE_OWNER_WRITE: (PhaseId.PAGE_ALIGNED_SPLIT,),
}
"""Direct needs: a phase is active for a batch only if all of these are active too."""


def closure_of_needs(phase: PhaseId) -> tuple[PhaseId, ...]:
    """Every phase ``phase`` needs, directly or through another, in ascending order."""
    seen: set[PhaseId] = set()
    stack = list(PHASE_NEEDS[phase])
    while stack:
        need = stack.pop()
        if need not in seen:
            seen.add(need)
            stack.extend(PHASE_NEEDS[need])
    return tuple(sorted(seen))


def parse_phase_list(text: str) -> frozenset[PhaseId]:
    """``"1,3"``, ``"all"`` or ``"none"`` (or ``""``) to a set of phases.

    Raises:
        ValueError: an entry is not a phase number 1..5.
    """
    text = text.strip().lower()
    if text == "all":
        return frozenset(PhaseId)
    if text in ("", "none", "0"):
        return frozenset()
    phases = set()
    for part in text.split(","):
        try:
            phases.add(PhaseId(int(part)))
        except ValueError:
            raise ValueError(
                f"phase list entries must be numbers 1..5, 'all' or 'none', got {part.strip()!r}"
            ) from None
    return frozenset(phases)
