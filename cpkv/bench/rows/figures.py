"""The figures of ``cpkv bench --rows``: one entry per op and point, and what is read off
them, the projection of a chunk over all layers at each level, and slot against unique
remap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpkv.bench.rows.timing import CLOCK_FLOOR_S, Timing

__all__ = [
    "TIE_BAND",
    "ProjectionRow",
    "RemapVerdict",
    "RowsEntry",
    "Timing",
    "projection",
    "slot_vs_unique",
]

TIE_BAND = 0.1
"""Slot and unique are a ``tie`` when their chunk times are this close (share of the
slower)."""


@dataclass(frozen=True, slots=True)
class RowsEntry:
    """One op at one point, measured on rank 0."""

    op: str
    variant: str
    history: int
    cp_size: int
    bs: int
    shared_prefix: bool
    per: str
    levels: tuple[int, ...]
    bytes: int
    timing: Timing
    scratch_bytes: int
    planned_scratch_bytes: int | None
    budget: str
    plan_seconds: float | None

    @property
    def seconds(self) -> float:
        """The op's median round, on the run's clock."""
        return self.timing.seconds

    @property
    def gb_per_s(self) -> float:
        """Bytes written per second, in GB (1e9)."""
        return self.bytes / max(self.seconds, CLOCK_FLOOR_S) / 1e9

    @property
    def ratio_to_copy(self) -> float:
        """Its rate over a contiguous copy's of the same bytes, in the same rounds: the
        copy's median round over the op's median round."""
        return self.timing.ratio

    @property
    def ratio_to_copy_best(self) -> float:
        """The fastest round's rate over the fastest copy's (less noise on a busy machine)."""
        return self.timing.best_ratio

    @property
    def scratch_over_plan(self) -> float | None:
        """Measured scratch over the plan's budget; None where the plan budgets none."""
        if not self.planned_scratch_bytes:
            return None
        return self.scratch_bytes / self.planned_scratch_bytes

    def to_json(self) -> dict[str, Any]:
        """One entry of ``real_rows``: the timing's fields and figures stand beside the
        others, each round's seconds last."""
        fields = asdict(self)
        timing: dict[str, Any] = fields.pop("timing")
        t = self.timing
        rounds = {name: list(timing.pop(name)) for name in ("op_rounds", "copy_rounds")}
        for name in ("op_wall_rounds", "copy_wall_rounds"):
            del timing[name]
        return (
            fields
            | {
                "seconds": t.seconds,
                "copy_seconds": t.copy_seconds,
                "rounds": t.rounds,
                "placements": t.placements,
                "placement_rounds": list(timing.pop("placement_rounds") or (t.rounds,)),
                "best_seconds": t.best_seconds,
                "copy_best_seconds": t.copy_best_seconds,
                "wall_seconds": t.wall_seconds,
                "copy_wall_seconds": t.copy_wall_seconds,
            }
            | timing
            | {
                "levels": list(self.levels),
                "gb_per_s": self.gb_per_s,
                "ratio_to_copy": self.ratio_to_copy,
                "ratio_low": t.ratio_low,
                "ratio_high": t.ratio_high,
                "noisy": t.noisy,
                "ratio_to_copy_best": self.ratio_to_copy_best,
                "scratch_over_plan": self.scratch_over_plan,
            }
            | rounds
        )


@dataclass(frozen=True, slots=True)
class ProjectionRow:
    """One chunk over all layers at one level, from the per-layer ops (rank 0)."""

    history: int
    bs: int
    cp_size: int
    read: str
    """The view op levels >= 2 use: ``slot``, ``unique`` or ``peer-read``."""
    level: int
    seconds: float
    bytes: int
    seconds_vs_level0: float
    """Time added (+) or saved (-) against level 0."""


@dataclass(frozen=True, slots=True)
class RemapVerdict:
    """Slot against unique remap at one point and read, per chunk over all layers."""

    history: int
    bs: int
    cp_size: int
    shared_prefix: bool
    read: str
    """``gather`` or ``peer-read``."""
    slot_bytes: int
    unique_bytes: int
    slot_seconds: float
    unique_seconds: float
    """Per chunk: every layer's view, plus the host plan once."""
    slot_scratch_bytes: int
    unique_scratch_bytes: int
    slot_plan_seconds: float
    unique_plan_seconds: float

    @property
    def winner(self) -> str:
        """The faster remap per chunk; ``tie`` when the two are within ``TIE_BAND`` of the
        slower (equal bytes through the same op differ by noise alone)."""
        slower = max(self.slot_seconds, self.unique_seconds)
        if abs(self.slot_seconds - self.unique_seconds) <= TIE_BAND * slower:
            return "tie"
        return "unique" if self.unique_seconds < self.slot_seconds else "slot"

    def to_json(self) -> dict[str, Any]:
        """One entry of ``slot_vs_unique``."""
        return asdict(self) | {"winner": self.winner}


def _level_ops(level: int, read: str) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """``(per-layer ops, tail op)`` a history batch runs at ``level``."""
    if level <= 1:
        layer = [("write", "replicated"), ("rollback-save", "replicated")]
        return layer, ("tail", "full" if level == 0 else "narrow")
    write = "direct" if level == 5 else "owner-filtered"
    layer = [("write", write), ("rollback-save", write), ("view", read)]
    if level == 5 and read.startswith("peer-read"):
        layer.append(("current-gather", "all-gather"))  # NOTE: the read needs the chunk
    return layer, ("tail", "narrow")


def projection(entries: Sequence[RowsEntry], num_layers: int) -> list[ProjectionRow]:
    """Per point (own histories) and read: every level's chunk time over ``num_layers``."""
    points = sorted({(e.history, e.bs, e.cp_size) for e in entries if not e.shared_prefix})
    rows = []
    for history, bs, cp in points:
        found = {
            (e.op, e.variant): e
            for e in entries
            if (e.history, e.bs, e.cp_size, e.shared_prefix) == (history, bs, cp, False)
        }
        for read in ("slot", "unique", "peer-read"):
            base = None
            for level in range(6):
                layer, tail = _level_ops(level, read)
                ops = [found[key] for key in layer]
                seconds = num_layers * sum(e.seconds for e in ops) + found[tail].seconds
                nbytes = num_layers * sum(e.bytes for e in ops) + found[tail].bytes
                base = seconds if base is None else base
                rows.append(
                    ProjectionRow(history, bs, cp, read, level, seconds, nbytes, seconds - base)
                )
    return rows


def slot_vs_unique(entries: Sequence[RowsEntry], num_layers: int) -> list[RemapVerdict]:
    """Every point's slot and unique views side by side, under gather and peer-read."""
    views = {
        (e.history, e.bs, e.cp_size, e.shared_prefix, e.variant): e
        for e in entries
        if e.op == "view"
    }
    rows = []
    for (history, bs, cp, shared, variant), slot in sorted(views.items()):
        if variant not in ("slot", "peer-read"):
            continue
        unique = views[
            (history, bs, cp, shared, "unique" if variant == "slot" else "peer-read-unique")
        ]
        rows.append(
            RemapVerdict(
                history=history,
                bs=bs,
                cp_size=cp,
                shared_prefix=shared,
                read="gather" if variant == "slot" else "peer-read",
                slot_bytes=num_layers * slot.bytes,
                unique_bytes=num_layers * unique.bytes,
                slot_seconds=num_layers * slot.seconds + (slot.plan_seconds or 0.0),
                unique_seconds=num_layers * unique.seconds + (unique.plan_seconds or 0.0),
                slot_scratch_bytes=slot.scratch_bytes,
                unique_scratch_bytes=unique.scratch_bytes,
                slot_plan_seconds=slot.plan_seconds or 0.0,
                unique_plan_seconds=unique.plan_seconds or 0.0,
            )
        )
    return rows
