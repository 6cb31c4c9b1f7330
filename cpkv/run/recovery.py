"""What rank 0 decides when every rank agreed that a batch failed: which phase to drop, or
stop (``docs/reliability.md``, "Failed batches").

The failure's points name the suspects (``phases.attribution``); the highest that can be
dropped is killed with a structured reason (``KILLED cause=error batch=3 ranks=1
at=kv_write``, or ``attributed=no`` when the failure could not be told), and the batch
runs again on the plan the gate now picks. Each kill drops a phase that was active, so a
batch is rerun at most once per phase killed. With no suspect left to drop, the run stops,
named.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv_core.planning import ScheduledBatch
from cpkv_core.runtime import BatchFailure
from phases import BatchPlan, Gate
from phases.attribution import Suspects, suspects


@dataclass(frozen=True, slots=True)
class PhaseKill:
    """A kill switch a failed batch tripped (rank 0's record)."""

    phase: int
    batch: int
    cause: str
    """``error``, ``debug_check`` or ``nonfinite`` (``FailureCause``)."""
    attributed: bool
    """The failure named this phase's path; False: it could not be told, and the phase was
    dropped as the highest active one."""
    points: tuple[str, ...]
    """The decision points the failure was seen in (empty when it could not be told)."""
    ranks: tuple[int, ...]
    """The ranks that failed."""
    message: str
    """What the first failing rank said."""

    @property
    def replay(self) -> str:
        """The ``cpkv explain --killed`` value that replays this kill."""
        return f"{self.phase}@{self.batch}:{self.cause}"


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """A run of a batch that failed on every rank's agreement, was rolled back and rerun."""

    batch: int
    phase: int
    """The phase the failed attempt ran at."""
    cause: str
    seconds: float
    """Rank 0's wall time of the attempt: the step's broadcast, the run, the votes, the
    rollback and the verdict."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """Rank 0's decision after a failed batch, the same on every rank: ``kill`` tripped and
    the batch rerun, or ``stop`` (the reason the run stops) when no phase is left."""

    kill: PhaseKill | None
    stop: str = ""


def recover(
    gate: Gate, scheduled: ScheduledBatch, decision: BatchPlan, failure: BatchFailure
) -> Recovery:
    """Trips the kill switch of the phase to drop for ``failure`` (the batch as ``decision``
    ran it), or says why the run stops."""
    found = suspects(gate, scheduled, decision, failure.points)
    if not found.phases:
        return Recovery(None, f"no phase is left to drop: {_why_none(found, failure)}")
    phase = found.phases[0]
    kill = PhaseKill(
        phase=int(phase),
        batch=failure.batch,
        cause=str(failure.cause),
        attributed=found.attributed,
        points=tuple(str(p) for p in failure.points),
        ranks=failure.ranks,
        message=failure.messages[0],
    )
    where = ("at", ",".join(kill.points)) if found.attributed else ("attributed", "no")
    ranks = ",".join(map(str, failure.ranks))
    gate.kill(phase, (("cause", kill.cause), ("batch", kill.batch), ("ranks", ranks), where))
    return Recovery(kill)


def _why_none(found: Suspects, failure: BatchFailure) -> str:
    """Why no suspect can be dropped."""
    kept = ", ".join(str(int(p)) for p in found.kept)
    stays = "cannot be dropped for one batch (its fallback needs KV at rest laid out otherwise)"
    if found.attributed and found.kept:
        return f"the failure is in phase {kept}'s path, which {stays}"
    if found.attributed:
        return f"the failure is in phase 0's path ({','.join(failure.points)})"
    if found.kept:
        return f"the failure could not be told, and the only active phase left, {kept}, {stays}"
    return "the failure could not be told, and no phase is active for the batch"
