"""Shadow verification and game-day faults as the app shows them: the fault, the summary,
its text (the summary of a verify run is ``verify.shadow_summary``, of a PD run
``pd.run_entries``).

``--shadow-rate R`` runs a deterministic share of batches twice (the chosen path and its
fallback) and trips a phase's kill switch on a mismatch; ``--inject-fault
PHASE[:KIND][@BATCH]`` corrupts that phase's candidate path (or makes it fail on one rank:
``raise``, ``nonfinite``) so an operator can watch the guard catch it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv.common.console import BadInput
from cpkv_core.planning import BatchSpec
from cpkv_core.runtime import (
    FAILING_KINDS,
    FAULT_KINDS,
    Fault,
    FaultKind,
    FaultPoint,
    ShadowOutcome,
)

FAULT_POINTS: dict[int, FaultPoint] = {
    1: FaultPoint.NARROW_OUTPUT,
    3: FaultPoint.CURRENT_REUSE,
    4: FaultPoint.PAGE_ALIGNED_SPLIT,
    5: FaultPoint.DIRECT_WRITE,
}
"""The candidate path each phase's fault corrupts (phase 2 changes KV at rest: no fallback
runs beside it)."""


def parse_fault(text: str | None) -> Fault | None:
    """``PHASE[:KIND][@BATCH]`` as a ``Fault``; the kind defaults to the phase's first, and
    without ``@BATCH`` the fault hits every batch that takes its path.

    Raises:
        BadInput: an unknown phase, a kind the phase does not take or a malformed batch.
    """
    if text is None:
        return None
    spec, at, batch_text = text.partition("@")
    phase_text, _, kind_text = spec.partition(":")
    phases = ", ".join(map(str, FAULT_POINTS))
    if not phase_text.strip().isdigit() or int(phase_text) not in FAULT_POINTS:
        raise BadInput(
            f"--inject-fault takes PHASE[:KIND][@BATCH] with PHASE in {phases}, got {text!r}"
        )
    if at and not batch_text.strip().isdigit():
        raise BadInput(f"--inject-fault {text}: BATCH after @ must be a batch number")
    batch = int(batch_text) if at else None
    point = FAULT_POINTS[int(phase_text)]
    kinds = FAULT_KINDS[point]
    if not kind_text:
        return Fault(point, kinds[0], batch)
    if kind_text not in {k.value for k in kinds}:
        allowed = ", ".join(kinds)
        raise BadInput(f"--inject-fault {phase_text} takes KIND {allowed}, got {kind_text!r}")
    return Fault(point, FaultKind(kind_text), batch)


def check_fault_batch(fault: Fault | None, batches: Sequence[BatchSpec]) -> None:
    """Refuses a fault aimed at a batch the trace does not hold.

    Raises:
        BadInput: ``@BATCH`` names no batch of ``batches``.
    """
    at = None if fault is None else fault.batch
    if at is not None and at not in {b.batch for b in batches}:
        raise BadInput(f"--inject-fault ...@{at}: the trace has no batch {at}")


def fault_phase(fault: Fault) -> int:
    """The phase whose candidate path ``fault`` corrupts."""
    return next(p for p, point in FAULT_POINTS.items() if point is fault.point)


def fault_text(fault: Fault | None) -> str | None:
    """``PHASE:KIND`` or ``PHASE:KIND@BATCH`` as the option took it; None without a fault."""
    if fault is None:
        return None
    at = "" if fault.batch is None else f"@{fault.batch}"
    return f"{fault_phase(fault)}:{fault.kind}{at}"


def shadow_fault(fault: Fault | None) -> str | None:
    """The fault a shadow summary reports: a data-corrupting one (the failing kinds are
    the failure summary's)."""
    return None if fault is None or fault.kind in FAILING_KINDS else fault_text(fault)


@dataclass(frozen=True, slots=True)
class Kill:
    """A kill switch a shadow mismatch tripped."""

    level: int
    phase: int
    batch: int
    max_abs_diff: float
    what: str


@dataclass(frozen=True, slots=True)
class ShadowSummary:
    """What the shadow comparisons of a verify run did."""

    rate: float
    fault: str | None
    sampled: int
    compared: int
    mismatches: int
    kills: tuple[Kill, ...]
    bytes: int
    seconds: float
    wrong_outputs_delivered: int
    """Batches whose delivered outputs differ from the reference."""

    @property
    def fault_caught(self) -> bool | None:
        """Whether a mismatch killed the injected fault's phase; None without a fault."""
        if self.fault is None:
            return None
        phase = int(self.fault.split(":")[0].split("@")[0])
        return any(k.phase == phase for k in self.kills)

    def to_json(self) -> dict[str, Any]:
        """The ``shadow`` section of ``cpkv verify --json``."""
        kills = [
            asdict(k) | {"max_abs_diff": None if k.max_abs_diff == float("inf") else k.max_abs_diff}
            for k in self.kills
        ]
        return asdict(self) | {
            "fault_caught": self.fault_caught,
            "phases_killed": sorted({k.phase for k in self.kills}),
            "kills": kills,
            "seconds": round(self.seconds, 6),
        }

    def text(self) -> str:
        """One paragraph for the human reports."""
        head = (
            f"shadow: rate {self.rate:g}, {self.sampled} batches sampled, {self.compared} "
            f"comparisons, {self.mismatches} mismatches, {self.bytes:,} bytes, "
            f"{self.seconds:.2f} s"
        )
        kills = "".join(
            f"; phase {k.phase} killed at level {k.level} batch {k.batch} ({k.what} differ)"
            for k in self.kills
        )
        tail = f"; {self.wrong_outputs_delivered} wrong outputs delivered"
        if self.fault is not None:
            # NOTE: "by the shadow": a fault the shadow misses may still be caught when its batch
            # fails (the failures line says so), and the two lines must not read as a contradiction.
            caught = "CAUGHT" if self.fault_caught else "NOT caught"
            tail += f"; injected fault {self.fault}: {caught} by the shadow"
        return head + kills + tail


@dataclass(frozen=True, slots=True)
class ShadowEntry:
    """One batch of one level as the shadow summary reads it."""

    level: int
    batch: int
    outcome: ShadowOutcome | None
    bytes: int


def summarize(
    rate: float, fault: str | None, entries: Sequence[ShadowEntry], wrong: int
) -> ShadowSummary:
    """The shadow figures of ``entries``; ``wrong`` outputs were delivered."""
    kills = tuple(
        Kill(e.level, m.phase, e.batch, m.max_abs_diff, m.what)
        for e in entries
        if e.outcome is not None
        for m in e.outcome.mismatches
    )
    outcomes = [e.outcome for e in entries if e.outcome is not None]
    return ShadowSummary(
        rate=rate,
        fault=fault,
        sampled=len(outcomes),
        compared=sum(len(o.compared) for o in outcomes),
        mismatches=len(kills),
        kills=kills,
        bytes=sum(e.bytes for e in entries),
        seconds=sum(o.seconds for o in outcomes),
        wrong_outputs_delivered=wrong,
    )
