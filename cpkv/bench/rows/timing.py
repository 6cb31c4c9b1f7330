"""The timing of one op of ``cpkv bench --rows``: its rounds and its copy's, taken in turn
(op, copy, op, copy ...), and what is read off them: the ratio of the medians and its
spread, the lowest and highest ratio of one round's copy to the same round's op.

A run times every op at ``placements`` instances of its buffers (``run.run_rows_bench``)
and pools their rounds (``Timing.pooled``): where an op's buffers sit in memory moves its
time between instances by more than its rounds at one instance spread (up to 1.8x for
``pd-pack`` at 128K; the copy beside it, in buffers of its own, barely moves), so a spread
over one instance says nothing about the next run.

A round's op and copy run back to back on the same clock, so whatever slows the machine in
that round slows both; the per-round ratios show how far the rounds agree. An entry whose
spread is wider than ``NOISY_SPREAD`` of its ratio is marked ``noisy``: its ratio stands,
but the rounds disagreed by more than the bench's figures are read to.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CLOCK_FLOOR_S", "NOISY_SPREAD", "Timing"]

CLOCK_FLOOR_S = 1e-9
"""The least seconds a round is read as when a ratio divides by it (the clocks' resolution):
a round the clock did not see pass gives a large ratio, not a division by zero (an op's
round read 0 s once on the thread-CPU clock next to ``yes``, and the run lost its JSON)."""
NOISY_SPREAD = 0.5
"""An entry is ``noisy`` when its highest per-round ratio minus its lowest is more than this
share of its ratio of medians (0.5: e.g. 0.6-0.9 around 0.75 is noisy, 0.7-0.9 around 0.8 is
not)."""


def _joined(parts: Sequence[tuple[float, ...] | None]) -> tuple[float, ...] | None:
    """Every part's rounds in order; None when a part has none (wall rounds on CUDA)."""
    joined: list[float] = []
    for part in parts:
        if part is None:
            return None
        joined += part
    return tuple(joined)


@dataclass(frozen=True, slots=True)
class Timing:
    """One op's timed rounds and its copy's, in seconds on the run's clock
    (``rounds.op_clock``); ``op_rounds[i]`` and ``copy_rounds[i]`` are one round.

    Invariant: both hold the same number of rounds, at least one.
    """

    op_rounds: tuple[float, ...]
    """The op's seconds in each round the medians are over."""
    copy_rounds: tuple[float, ...]
    """The copy's seconds in the same rounds, each right after the op."""
    op_wall_rounds: tuple[float, ...] | None = None
    """The op's rounds on the wall clock (None on CUDA, where a round's wall time would need
    a host sync inside it)."""
    copy_wall_rounds: tuple[float, ...] | None = None
    placement_rounds: tuple[int, ...] = ()
    """How many of the rounds, in order, were taken at each instance of the op's buffers
    (``pooled``); empty when all were taken at one."""
    page_faults: int = 0
    """Minor page faults the op's timed calls took, all rounds together, set-aside rounds
    included (0: it ran on memory the allocator held, as on a device)."""
    faulted_rounds: int = 0
    """Rounds set aside because the op faulted fresh memory in (the CPU allocator's
    placement); 0 when there were too many to set aside and every round counts."""

    def __post_init__(self) -> None:
        if not self.op_rounds or len(self.op_rounds) != len(self.copy_rounds):
            raise ValueError(
                f"a timing needs as many copy rounds as op rounds, at least one; got "
                f"{len(self.op_rounds)} op and {len(self.copy_rounds)} copy rounds"
            )
        if self.placement_rounds and (
            sum(self.placement_rounds) != len(self.op_rounds) or min(self.placement_rounds) < 1
        ):
            raise ValueError(
                f"placement rounds {list(self.placement_rounds)} do not split the "
                f"{len(self.op_rounds)} rounds into instances of at least one round each"
            )

    @classmethod
    def pooled(cls, timings: Sequence[Timing]) -> Timing:
        """One timing of every round of ``timings`` (one op at several instances of its
        buffers), in order: its medians and spread are over them all."""
        if not timings:
            raise ValueError("pooling needs at least one timing")
        return cls(
            op_rounds=tuple(r for t in timings for r in t.op_rounds),
            copy_rounds=tuple(r for t in timings for r in t.copy_rounds),
            op_wall_rounds=_joined([t.op_wall_rounds for t in timings]),
            copy_wall_rounds=_joined([t.copy_wall_rounds for t in timings]),
            placement_rounds=tuple(n for t in timings for n in t.placement_rounds or (t.rounds,)),
            page_faults=sum(t.page_faults for t in timings),
            faulted_rounds=sum(t.faulted_rounds for t in timings),
        )

    @property
    def rounds(self) -> int:
        """Rounds the medians are over."""
        return len(self.op_rounds)

    @property
    def placements(self) -> int:
        """Instances of the op's buffers the rounds were taken at."""
        return len(self.placement_rounds) or 1

    @property
    def seconds(self) -> float:
        """The op's median round."""
        return statistics.median(self.op_rounds)

    @property
    def copy_seconds(self) -> float:
        """The copy's median round."""
        return statistics.median(self.copy_rounds)

    @property
    def wall_seconds(self) -> float | None:
        """The op's median round on the wall clock (None on CUDA)."""
        return None if self.op_wall_rounds is None else statistics.median(self.op_wall_rounds)

    @property
    def copy_wall_seconds(self) -> float | None:
        """The copy's median round on the wall clock (None on CUDA)."""
        walls = self.copy_wall_rounds
        return None if walls is None else statistics.median(walls)

    @property
    def best_seconds(self) -> float:
        """The op's fastest round."""
        return min(self.op_rounds)

    @property
    def copy_best_seconds(self) -> float:
        """The copy's fastest round."""
        return min(self.copy_rounds)

    @property
    def ratio(self) -> float:
        """The copy's median round over the op's: the op's rate over the copy's."""
        return self.copy_seconds / max(self.seconds, CLOCK_FLOOR_S)

    @property
    def best_ratio(self) -> float:
        """The copy's fastest round over the op's fastest round."""
        return self.copy_best_seconds / max(self.best_seconds, CLOCK_FLOOR_S)

    @property
    def round_ratios(self) -> tuple[float, ...]:
        """Each round's copy over the same round's op."""
        pairs = zip(self.op_rounds, self.copy_rounds, strict=True)
        return tuple(copy / max(op, CLOCK_FLOOR_S) for op, copy in pairs)

    @property
    def ratio_low(self) -> float:
        """The lowest per-round ratio."""
        return min(self.round_ratios)

    @property
    def ratio_high(self) -> float:
        """The highest per-round ratio."""
        return max(self.round_ratios)

    @property
    def noisy(self) -> bool:
        """The spread is wider than ``NOISY_SPREAD`` of the ratio of medians."""
        return self.ratio_high - self.ratio_low > NOISY_SPREAD * self.ratio
