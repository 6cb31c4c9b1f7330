"""What failed batches cost a run, as ``verify``, ``demo`` and ``pd`` show it: the phases
they killed, the batches rerun and the time it took, and the batches lost (none, or the run
would have stopped)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv.run.jobs import LevelRun
from cpkv.run.recovery import FailedAttempt, PhaseKill
from cpkv.run.shadow import fault_text
from cpkv_core.runtime import FAILING_KINDS, Fault


@dataclass(frozen=True, slots=True)
class LevelKill:
    """A kill switch a failed batch tripped in the run of one level."""

    level: int
    kill: PhaseKill


@dataclass(frozen=True, slots=True)
class Rerun:
    """A batch of one level that failed and was run again until it committed."""

    level: int
    batch: int
    failed: tuple[FailedAttempt, ...]
    """Its failed attempts, in order (one rerun followed each)."""
    phase: int
    """The phase its last run, the one delivered, took."""
    seconds: float
    """Rank 0's time of that run."""


@dataclass(frozen=True, slots=True)
class FailureSummary:
    """The failed batches of a run, over every level."""

    fault: str | None
    """The injected fault, ``PHASE:KIND[@BATCH]``, if any."""
    failing: bool
    """The fault is of a failing kind (``raise``, ``nonfinite``): failed batches are how it
    is caught. A data-corrupting one is shadow's, or the debug checks' when they are on."""
    kills: tuple[LevelKill, ...]
    reruns: tuple[Rerun, ...]
    batches_lost: int
    """Batches of the trace with no delivered output (a run that loses one stops)."""

    @property
    def shown(self) -> bool:
        """Whether a report prints it: a batch failed, or a failing fault was injected."""
        return bool(self.kills) or (self.fault is not None and self.failing)

    @property
    def rerun_count(self) -> int:
        """Runs of a batch after one of its attempts failed."""
        return sum(len(r.failed) for r in self.reruns)

    @property
    def lost_seconds(self) -> float:
        """Time the failed attempts took: what the reruns cost beyond the batches' runs."""
        return sum(a.seconds for r in self.reruns for a in r.failed)

    @property
    def rerun_seconds(self) -> float:
        """Time the delivered runs of rerun batches took."""
        return sum(r.seconds for r in self.reruns)

    @property
    def fault_caught(self) -> bool | None:
        """Whether a failed batch killed the injected fault's phase; None without one."""
        if self.fault is None:
            return None
        phase = int(self.fault.split(":")[0])
        return any(k.kill.phase == phase for k in self.kills)

    def to_json(self) -> dict[str, Any]:
        """The ``failures`` section of ``cpkv verify --json`` (and of ``pd``)."""
        return {
            "fault": self.fault,
            "fault_caught": self.fault_caught,
            "fault_fails_batches": self.failing,
            "kills": [
                {"level": k.level, **asdict(k.kill), "replay": k.kill.replay} for k in self.kills
            ],
            "reruns": [
                {
                    "level": r.level,
                    "batch": r.batch,
                    "failed": [asdict(a) | {"seconds": round(a.seconds, 6)} for a in r.failed],
                    "phase": r.phase,
                    "seconds": round(r.seconds, 6),
                }
                for r in self.reruns
            ],
            "rerun_count": self.rerun_count,
            "batches_lost": self.batches_lost,
            "lost_seconds": round(self.lost_seconds, 6),
            "rerun_seconds": round(self.rerun_seconds, 6),
        }

    def text(self, label: str = "failures") -> str:
        """One paragraph for the human reports, headed ``label``."""
        kills = "".join(
            f"; phase {k.kill.phase} killed at level {k.level} batch {k.kill.batch} "
            f"({_words(k.kill)})"
            for k in self.kills
        )
        reruns = "".join(
            f"; level {r.level} batch {r.batch} rerun on phase {r.phase} after "
            + ", ".join(f"phase {a.phase} failed ({a.cause})" for a in r.failed)
            for r in self.reruns
        )
        head = (
            f"{label}: {_count(self.rerun_count, 'rerun')}, "
            f"{self.lost_seconds:.2f} s lost in failed attempts, "
            f"{self.rerun_seconds:.2f} s in the reruns, "
            f"{_count(self.batches_lost, 'batch', 'batches')} lost"
        )
        tail = ""
        if self.fault is not None and (self.failing or self.fault_caught):
            caught = "CAUGHT" if self.fault_caught else "NOT caught"
            tail = f"; injected fault {self.fault}: {caught}"
        return head + kills + reruns + tail


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _words(kill: PhaseKill) -> str:
    """``cause=error ranks=1 at=kv_write: PathError: ...``."""
    where = f"at={','.join(kill.points)}" if kill.attributed else "attributed=no"
    ranks = ",".join(map(str, kill.ranks))
    return f"cause={kill.cause} ranks={ranks} {where}: {kill.message}"


def summarize_failures(
    fault: Fault | None, levels: Sequence[int], runs: Sequence[LevelRun], batches: int
) -> FailureSummary:
    """The failures of every level run of a trace of ``batches`` batches."""
    kills, reruns = [], []
    for level, run in zip(levels, runs, strict=True):
        kills += [LevelKill(level, k) for k in run.kills]
        for i, step in enumerate(run.steps):
            number = step.scheduled.batch
            failed = tuple(a for a in run.failed if a.batch == number)
            if failed:
                seconds = run.rank_outputs[i][0].seconds
                reruns.append(Rerun(level, number, failed, step.decision.phase, seconds))
    lost = len(levels) * batches - sum(len(run.outputs) for run in runs)
    failing = fault is not None and fault.kind in FAILING_KINDS
    return FailureSummary(fault_text(fault), failing, tuple(kills), tuple(reruns), lost)
