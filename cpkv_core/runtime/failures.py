"""A batch that fails in its path: what one rank saw, and the verdict every rank agrees on.

A rank's failure is local: an exception in the host half of the batch (planning, upload,
expansion) or in a collective-free op of the run step (the KV write, a local key read, the
tail after its gather), a debug check that fired, or a non-finite value. None of these
leaves the group out of step: the rank records the failure and keeps taking part in the
step's collectives. The batch's fate is then a vote (``agree``): every rank posts whether
it failed, why and where, twice per batch (before the step's first collective and before
the commit), so that a failure on one rank is the same verdict on every rank before anything
commits. An exception raised inside a collective-bearing op (a gather) leaves the peers in
that collective: it is not recorded here, and the run stops as it does for a rank that
died, bounded by the group's collective timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from cpkv_core.dist.comm import Communicator
from cpkv_core.dist.value_collectives import broadcast_value, gather_value
from cpkv_core.planning import DecisionPoint

__all__ = [
    "BatchFailed",
    "BatchFailure",
    "FailureCause",
    "LocalFailure",
    "PathError",
    "agree",
    "error_failure",
    "merge_failures",
]


class FailureCause(StrEnum):
    """Why a batch failed, in order of precedence when ranks disagree."""

    ERROR = "error"
    """An exception in the batch's path."""
    DEBUG_CHECK = "debug_check"
    """A sharded-KV invariant check fired (``SGLANG_DEBUG_CP_SHARED_KV``)."""
    NONFINITE = "nonfinite"
    """A NaN or an infinity in the rows the batch wrote or in its outputs."""


_CAUSES = tuple(FailureCause)
_POINTS = tuple(DecisionPoint)


class PathError(RuntimeError):
    """An exception raised inside the path of one decision point (``point``)."""

    def __init__(self, point: DecisionPoint, message: str) -> None:
        super().__init__(message)
        self.point = point


@dataclass(frozen=True, slots=True)
class LocalFailure:
    """What failed on this rank in one batch."""

    cause: FailureCause
    points: frozenset[DecisionPoint]
    """The decision points the failure was seen in; empty when it cannot be told."""
    message: str
    certain: bool = True
    """The points hold whatever other ranks saw (an op raised there, a check fired there,
    a row written there is not finite); False when they hold only if no rank saw the
    failure upstream of them (outputs not finite after a finite tail input)."""


def error_failure(exc: BaseException, point: DecisionPoint | None = None) -> LocalFailure:
    """An exception as a failure; a ``PathError`` names its own point."""
    if isinstance(exc, PathError):
        point = exc.point
    where = frozenset() if point is None else frozenset({point})
    return LocalFailure(FailureCause.ERROR, where, f"{type(exc).__name__}: {exc}")


def _where(
    named: list[tuple[frozenset[DecisionPoint], bool]],
) -> tuple[frozenset[DecisionPoint], bool]:
    """Points and certainty of several sightings of one cause: the certain ones' points if
    any names some; else every sighting's, when each names some; else none."""
    certain = [points for points, sure in named if sure and points]
    if certain:
        return frozenset().union(*certain), True
    if all(points for points, _ in named):
        return frozenset().union(*(points for points, _ in named)), False
    return frozenset(), False


def merge_failures(failures: Iterable[LocalFailure]) -> LocalFailure | None:
    """One rank's failures of one batch as one: the first cause in precedence, where its
    sightings were (``_where``), its first message."""
    seen = list(failures)
    if not seen:
        return None
    cause = min((f.cause for f in seen), key=_CAUSES.index)
    mine = [f for f in seen if f.cause is cause]
    points, certain = _where([(f.points, f.certain) for f in mine])
    return LocalFailure(cause, points, mine[0].message, certain)


@dataclass(frozen=True, slots=True)
class BatchFailure:
    """The verdict every rank of the group agreed on for a failed batch."""

    batch: int
    cause: FailureCause
    """The first cause in precedence over the failing ranks."""
    points: tuple[DecisionPoint, ...]
    """Where the failure was seen, in plan order (``_where`` over the ranks that failed
    with ``cause``); empty when it could not be told."""
    ranks: tuple[int, ...]
    """The ranks that failed."""
    messages: tuple[str, ...]
    """Each failing rank's message, in ``ranks`` order."""

    def describe(self) -> str:
        """``cause=error ranks=1 at=kv_write: PathError: ...`` (rank 0's words)."""
        at = f" at={','.join(self.points)}" if self.points else ""
        ranks = ",".join(map(str, self.ranks))
        return f"cause={self.cause} ranks={ranks}{at}: {self.messages[0]}"


class BatchFailed(RuntimeError):
    """Every rank agreed that a batch failed; nothing committed and its pool rows are as
    before it. The caller rolls the scheduler back and may rerun the batch."""

    def __init__(self, failure: BatchFailure) -> None:
        super().__init__(f"batch {failure.batch} failed: {failure.describe()}")
        self.failure = failure


def _vote(local: LocalFailure | None) -> tuple[int, int, int, int]:
    """``(failed, cause, points bitmask, certain)``."""
    if local is None:
        return (0, 0, 0, 0)
    mask = sum(1 << _POINTS.index(p) for p in local.points)
    return (1, _CAUSES.index(local.cause), mask, int(local.certain))


def _points(mask: int) -> frozenset[DecisionPoint]:
    return frozenset(p for i, p in enumerate(_POINTS) if mask >> i & 1)


def agree(comm: Communicator, batch: int, local: LocalFailure | None) -> BatchFailure | None:
    """The group's verdict on ``batch`` from every rank's ``local`` failure (None: this rank
    did not fail): None when no rank failed. Every rank of the group calls it together; on
    a failure every rank also gets every failing rank's message, so the verdict is the same
    on every rank."""
    votes = comm.all_gather_ints(_vote(local))
    failing = tuple(rank for rank, vote in enumerate(votes) if vote[0])
    if not failing:
        return None
    said = gather_value(comm, "" if local is None else local.message, str, "failure message")
    said = broadcast_value(comm, said, list[str], "failure messages")
    cause = min(votes[rank][1] for rank in failing)
    sightings = [(_points(v[2]), bool(v[3])) for v in votes if v[0] and v[1] == cause]
    points, _ = _where(sightings)
    return BatchFailure(
        batch=batch,
        cause=_CAUSES[cause],
        points=tuple(p for p in _POINTS if p in points),
        ranks=failing,
        messages=tuple(said[rank] for rank in failing),
    )
